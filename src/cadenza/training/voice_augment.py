"""Voice augmentation for a speech tokenizer trained on few voices: the same frames, said by another voice.

A frame tokenizer trained on one voice labels other voices badly (cadenza-tiny's, trained on joe alone, turned
flite's slt into gibberish through voice conversion, docs/cadenza-tiny.md). Each augmented item moves, label-
preserving and independently drawn:

* **pitch** (the f0 factor ``p``): WSOLA stretches the wave by ``p / tempo`` and resampling shortens it by ``p``, so
  the harmonics move by ``p`` and the speaking rate by ``tempo``; resampling also moves the spectral envelope by
  ``p``, which the next step takes back out;
* **formants** (the vocal-tract factor ``q``, VTLP): the log power spectrum (whisper's 40 Hz bins) is split into a
  smooth envelope (a moving average over ``ENVELOPE_BINS``) and the harmonic fine structure, and only the envelope is
  read at ``f * p / q``: a voice with the same harmonics and another vocal tract;
* **tempo**: frames are ``tempo`` times as short; the labels are read at the same positions of the speech;
* **noise**: white noise at a signal-to-noise ratio drawn from ``noise_snr_db``.

The result is whisper's log-mel (``cadenza.audio.whisper_mel``) of the augmented spectrum, so the tokenizer's input
path at inference is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from cadenza.audio.resample import resample
from cadenza.audio.speed_range import MAX_SPEED, MIN_SPEED
from cadenza.audio.time_scale import time_scale
from cadenza.audio.whisper_mel import WHISPER_SAMPLE_RATE, whisper_log_mel_from_power, whisper_power
from cadenza.errors import InputError

ENVELOPE_BINS = 9  # 360 Hz: wider than the harmonic spacing of voices up to ~300 Hz, narrower than a formant
LOG_FLOOR = 1e-10


@dataclass(frozen=True)
class VoiceAugmentConfig:
    """``probability``: share of training items augmented (0: off). Ranges are drawn uniformly on a log scale."""

    probability: float = 0.0
    pitch: tuple[float, float] = (1.0, 1.0)
    formant: tuple[float, float] = (1.0, 1.0)
    tempo: tuple[float, float] = (1.0, 1.0)
    noise_snr_db: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.probability <= 1.0:
            raise InputError(f"augment.probability must be in [0, 1], got {self.probability}")
        for name, lo_limit, hi_limit in (("pitch", 0.5, 2.5), ("formant", 0.6, 1.6), ("tempo", 0.7, 1.4)):
            lo, hi = getattr(self, name)
            if not lo_limit <= lo <= hi <= hi_limit:
                raise InputError(f"augment.{name} must be [low, high] within [{lo_limit}, {hi_limit}], got "
                                 f"{getattr(self, name)!r}")
        if self.noise_snr_db is not None and not 0 <= self.noise_snr_db[0] <= self.noise_snr_db[1]:
            raise InputError(f"augment.noise_snr_db must be [low, high] dB with 0 <= low <= high, got "
                             f"{self.noise_snr_db!r}")

    @property
    def enabled(self) -> bool:
        return self.probability > 0


@dataclass(frozen=True)
class VoiceDraw:
    """One augmentation's factors (1.0 / None: unchanged)."""

    pitch: float = 1.0
    formant: float = 1.0
    tempo: float = 1.0
    noise_snr_db: float | None = None


def draw(cfg: VoiceAugmentConfig, rng: np.random.Generator) -> VoiceDraw | None:
    """Factors for one item, or None when it stays as it is (``1 - probability`` of the time)."""
    if not cfg.enabled or rng.random() >= cfg.probability:
        return None

    def log_uniform(lo: float, hi: float) -> float:
        return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))

    snr = None if cfg.noise_snr_db is None else float(rng.uniform(*cfg.noise_snr_db))
    return VoiceDraw(log_uniform(*cfg.pitch), log_uniform(*cfg.formant), log_uniform(*cfg.tempo), snr)


def augmented_log_mel(wav16k: torch.Tensor, d: VoiceDraw, n_mels: int, rng: np.random.Generator) -> torch.Tensor:
    """``wav16k [samples]`` -> whisper log-mel ``[n_mels, frames]`` of the same speech in the drawn voice, with
    ``frames ~= samples / 160 / tempo``."""
    wav = wav16k.detach().to(torch.float32).cpu().numpy()
    # The WSOLA rate (p / tempo as long), within what WSOLA does: past it the tempo gives way, not the pitch.
    # WSOLA, not the engine's default phase vocoder: the shipped tokenizer was trained on these draws.
    speed = min(max(d.tempo / d.pitch, MIN_SPEED), MAX_SPEED)
    if speed != 1.0:
        wav = time_scale(wav, speed, WHISPER_SAMPLE_RATE, method="wsola")
    out = torch.from_numpy(np.ascontiguousarray(wav, np.float32))
    if d.pitch != 1.0:  # play it p times as fast: harmonics and envelope move up by p
        out = resample(out, round(WHISPER_SAMPLE_RATE * d.pitch), WHISPER_SAMPLE_RATE)
    if d.noise_snr_db is not None:
        level = float(out.pow(2).mean())
        noise = rng.standard_normal(out.shape[-1]).astype(np.float32)
        out = out + torch.from_numpy(noise) * math.sqrt(level / 10 ** (d.noise_snr_db / 10))
    power = whisper_power(out)[0]  # [201, frames]
    envelope_factor = d.formant / d.pitch
    if envelope_factor != 1.0:
        power = warp_envelope(power, envelope_factor)
    return whisper_log_mel_from_power(power[None], n_mels)[0]


def warp_envelope(power: torch.Tensor, factor: float) -> torch.Tensor:
    """``power [bins, frames]`` with its spectral envelope moved by ``factor`` in frequency (the envelope at ``f``
    becomes the one at ``f / factor``); the harmonic fine structure stays where it is."""
    log_power = power.clamp_min(LOG_FLOOR).log()
    padded = F.pad(log_power.T[:, None], (ENVELOPE_BINS // 2, ENVELOPE_BINS // 2), mode="replicate")
    envelope = F.avg_pool1d(padded, ENVELOPE_BINS, stride=1)[:, 0].T  # [bins, frames]
    fine = log_power - envelope
    bins = power.shape[0]
    source = (torch.arange(bins, dtype=torch.float32) / factor).clamp(max=bins - 1)
    lo = source.floor().long()
    hi = (lo + 1).clamp(max=bins - 1)
    w = (source - lo)[:, None]
    moved = envelope[lo] * (1 - w) + envelope[hi] * w
    return (moved + fine).exp()


def stretch_labels(labels: torch.Tensor, frames: int) -> torch.Tensor:
    """Frame labels ``[n]`` read at ``frames`` evenly spaced positions of the same speech (nearest frame)."""
    n = labels.numel()
    if frames == n or n == 0:
        return labels[:frames]
    index = ((torch.arange(frames, dtype=torch.float64) + 0.5) * n / frames).floor().long().clamp(max=n - 1)
    return labels[index]
