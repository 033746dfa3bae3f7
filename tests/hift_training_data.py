"""A tiny "hift" stage set-up shared by the vocoder training tests: the stage config (a 16-channel generator, narrow
discriminators, short crops), harmonic test signals and a six-utterance corpus of them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import soundfile as sf
import torch

SR = 24000
TINY_D = {"period_channels": [4, 8, 16, 16], "spec_channels": 4}
CONFIG = {"train": {"optim": {"lr": 2e-3}},
          "model": {"config": "official", "overrides": {"hift": {"base_channels": 16, "f0_predictor": {"cond_channels": 16}}}},
          "hift": {"discriminator": TINY_D, "segment_samples": 2880}}


def harmonic(f0: torch.Tensor, harmonics: int = 8) -> torch.Tensor:
    """Sum of harmonics (amplitude 1/k) of a per-sample f0 track ``[N]``."""
    phase = 2 * math.pi * torch.cumsum(f0, 0) / SR
    return sum(torch.sin(k * phase + k) / k for k in range(1, harmonics + 1))


def write_hift_corpus(d: Path) -> Path:
    """Six one-second utterances (gliding harmonic vowels over faint noise, two speakers) and their manifest in ``d``."""
    (d / "wavs").mkdir()
    g = torch.Generator().manual_seed(0)
    rows = []
    t = torch.arange(SR) / SR
    for i in range(6):
        f0 = 120 + 40 * i + 60 * torch.sin(2 * math.pi * 0.7 * t)
        wav = 0.3 * harmonic(f0) * (t < 0.7) + 0.02 * torch.randn(SR, generator=g)
        sf.write(d / "wavs" / f"{i}.wav", wav.numpy(), SR)
        rows.append({"audio": f"wavs/{i}.wav", "text": "a steady vowel", "speaker": f"s{i % 2}"})
    (d / "manifest.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return d
