"""The naturalness metric (DistillMOS MOS proxy): parity with the ``distillmos`` package, behaviour on real speech,
errors.

Tests that run the model need the DistillMOS weights, which ship in the ``distillmos`` wheel (CI installs it with
``pip install --no-deps distillmos==0.9.1``); they skip without it. The real-speech tests also need the shared
recordings: ``CADENZA_SHARED_AUDIO`` (default ``../shared/audio`` relative to the repository root).
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch

from cadenza.errors import AudioError, CheckpointError, MissingDependencyError
from cadenza.evaluation import naturalness as nat
from cadenza.evaluation.naturalness import load_naturalness_model, naturalness

REPO_ROOT = Path(__file__).resolve().parents[2]
AUDIO_DIR = Path(os.environ.get("CADENZA_SHARED_AUDIO") or REPO_ROOT / "../shared/audio").resolve()
EN_CLIP = "en_stereo_44k.wav"
SR = 16_000


@pytest.fixture(scope="module")
def model() -> nat.NaturalnessModel:
    try:
        return load_naturalness_model()
    except MissingDependencyError:
        pytest.skip(f"naturalness tests need the DistillMOS weights: {nat.INSTALL_HINT}")


@pytest.fixture(scope="module")
def en_clip() -> tuple[np.ndarray, int]:
    path = AUDIO_DIR / EN_CLIP
    if not path.is_file():
        pytest.skip(f"shared recording {path} not found (set CADENZA_SHARED_AUDIO)")
    samples, sr = sf.read(path, dtype="float32")  # [samples, 2] at 44.1 kHz
    return samples, sr


# --- deterministic inputs for the parity test (float32 torch, no files) ---------------------------------------------

def noise_clip() -> torch.Tensor:
    """3 s of seeded Gaussian noise at -20 dBFS RMS (one window, zero-padded)."""
    return 0.1 * torch.randn(3 * SR, generator=torch.Generator().manual_seed(1234), dtype=torch.float32)


def vibrato_tone() -> torch.Tensor:
    """2 s of a 220 Hz harmonic tone (5 partials, 1/k amplitudes) with a 5 Hz, +-6 Hz vibrato."""
    t = torch.arange(2 * SR, dtype=torch.float32) / SR
    phase = 2 * math.pi * 220.0 * t + (6.0 / 5.0) * (1 - torch.cos(2 * math.pi * 5.0 * t))  # integral of f0(t)
    return 0.3 * sum(torch.sin(k * phase) / k for k in range(1, 6))


def long_clip() -> torch.Tensor:
    """9 s (longer than one 7.68 s window: three windows averaged): a tone gated at 3 Hz over seeded noise."""
    t = torch.arange(9 * SR, dtype=torch.float32) / SR
    gate = (torch.sin(2 * math.pi * 3.0 * t) > 0).to(torch.float32)
    tone = 0.5 * torch.sin(2 * math.pi * 150.0 * t) + 0.25 * torch.sin(2 * math.pi * 300.0 * t)
    noise = torch.randn(9 * SR, generator=torch.Generator().manual_seed(99), dtype=torch.float32)
    return gate * tone + 0.02 * noise


# Reference scores: distillmos 0.9.1 (PyPI wheel, with torch 2.13.0 CPU, one thread) on exactly these tensors, made by
# the functions above:  m = distillmos.ConvTransformerSQAModel().eval(); with torch.no_grad(): m(x[None]).item()
# (``.eval()`` matters: the package returns the model in training mode, whose batch norms use batch statistics).
REFERENCE = {noise_clip: 1.9301681518554688, vibrato_tone: 1.6298284530639648, long_clip: 1.2853341102600098}


@pytest.mark.parametrize("make", list(REFERENCE), ids=lambda f: f.__name__)
def test_parity_with_the_distillmos_package(model, make):
    assert naturalness(make(), SR, model=model) == pytest.approx(REFERENCE[make], abs=1e-4)


def test_the_checkpoint_loads_strictly_into_our_module(model):
    checkpoint = torch.load(nat.weights_path(), map_location="cpu", weights_only=True)
    ours = model.state_dict()
    assert set(ours) == set(checkpoint["model"])
    for name, value in checkpoint["model"].items():
        assert torch.equal(ours[name], value), name
    # the position table is stored in the checkpoint; ours, computed from the formula, is the same table
    assert torch.allclose(nat._PositionEncoding().pe, checkpoint["model"][
        "transformer_pool_attn.transformer.position_encoding.pe"], atol=1e-6)
    assert not model.training


def test_windows_follow_the_package_segmentation():
    short = torch.ones(3 * SR)
    w = nat.windows(short)
    assert w.shape == (1, nat.WINDOW) and torch.equal(w[0, :3 * SR], short) and not w[0, 3 * SR:].any()
    assert nat.window_starts(nat.WINDOW) == [0]
    long = torch.arange(9 * SR, dtype=torch.float32)
    w = nat.windows(long)
    over = 9 * SR - nat.WINDOW  # 21120 samples beyond one window: ceil(21120 / 16000) + 1 = 3 windows
    assert w.shape == (3, nat.WINDOW)
    assert [int(x[0]) for x in w] == [0, over // 2, over]  # evenly spread from the start to the end
    assert torch.equal(w[-1], long[-nat.WINDOW:])
    starts = nat.window_starts(60 * SR)  # a minute: 54 windows, never more than 1 s apart
    assert len(starts) == 54 and starts[0] == 0 and starts[-1] == 60 * SR - nat.WINDOW
    assert max(np.diff(starts)) <= nat.MAX_HOP


def test_long_clips_are_scored_a_few_windows_at_a_time(model, monkeypatch):
    monkeypatch.setattr(nat, "WINDOWS_PER_BATCH", 2)  # 3 windows: a batch of 2, then 1 (8 by default)
    x = long_clip()
    with torch.inference_mode():
        all_at_once = float(model(nat.windows(x)).mean())  # the package's way: every window in one batch
    assert naturalness(x, SR, model=model) == pytest.approx(all_at_once, abs=1e-4)


def test_eval_runner_scores_naturalness_and_skips_silence(model, en_clip):
    from cadenza.evaluation.audio import to_16k_mono
    from cadenza.evaluation.runner import Evaluators

    evaluators = Evaluators(asr_model=object(), encoder=object())  # only the naturalness model is used here
    wav16 = to_16k_mono(*en_clip)
    assert evaluators.naturalness(wav16, "en") == pytest.approx(naturalness(wav16, SR, model=model), abs=1e-6)
    assert evaluators.naturalness(np.zeros(SR, np.float32), "silent") is None  # logged, not raised
    assert evaluators.naturalness(np.zeros(0, np.float32), "empty") is None
    assert evaluators.naturalness_model is model and evaluators.naturalness_note is None


def test_level_does_not_matter(model):
    x = vibrato_tone()  # each window is peak-normalised: only rounding differs (2e-4 measured)
    assert naturalness(0.01 * x, SR, model=model) == pytest.approx(naturalness(x, SR, model=model), abs=1e-3)


def test_real_speech_scores_well_above_the_same_speech_in_noise(model, en_clip):
    samples, sr = en_clip
    assert samples.ndim == 2 and sr == 44_100  # the stereo 44.1 kHz file, as read
    clean = naturalness(samples, sr, model=model)
    assert naturalness(samples.T, sr, model=model) == pytest.approx(clean, abs=1e-5)  # [channels, samples] too
    assert naturalness(torch.from_numpy(samples), sr, model=model) == pytest.approx(clean, abs=1e-5)
    assert nat.naturalness_file(AUDIO_DIR / EN_CLIP, model=model) == pytest.approx(clean, abs=1e-4)
    mono = samples.mean(axis=1)
    noise = np.random.default_rng(0).standard_normal(mono.shape).astype(np.float32)
    noisy = mono + noise * np.sqrt(np.mean(mono ** 2) / np.mean(noise ** 2))  # white noise at 0 dB SNR
    dirty = naturalness(noisy, sr, model=model)
    # measured: clean 4.30, 0 dB SNR 1.32 (teacher TTS renderings ~4.2, cadenza-tiny ~1.3)
    assert 3.8 < clean < 5.0 and 1.0 < dirty < 2.0
    assert clean - dirty > 2.0


def test_default_model_is_loaded_once(model):
    assert load_naturalness_model() is model
    assert 1.0 < naturalness(noise_clip().numpy(), SR) < 5.0  # numpy input, default model


@pytest.mark.parametrize(("audio", "message"), [
    (np.zeros(0, np.float32), "empty"),
    (np.zeros((2, 0), np.float32), "empty"),
    (np.array([0.1, np.nan, 0.2] * 8000, np.float32), "NaN or infinite"),
    (np.array([0.1, np.inf] * 8000, np.float32), "NaN or infinite"),
    (np.zeros(SR, np.float32), "silent"),
    (np.full(SR, 1e-6, np.float32), "silent"),
])
def test_unscorable_audio_is_an_audio_error(audio, message):
    with pytest.raises(AudioError, match=message):
        naturalness(audio, SR)  # raised before any model is loaded: runs without the weights


def _fake_spec(monkeypatch, folder: Path | None) -> None:
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name != "distillmos":
            return real(name, *args, **kwargs)
        return None if folder is None else SimpleNamespace(submodule_search_locations=[str(folder)])

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_missing_package_names_the_install_command(monkeypatch):
    _fake_spec(monkeypatch, None)
    with pytest.raises(MissingDependencyError, match=r"pip install --no-deps distillmos==0\.9\.1"):
        load_naturalness_model.__wrapped__()  # bypass the process-wide cache


def test_missing_weights_file_names_the_install_command(monkeypatch, tmp_path):
    _fake_spec(monkeypatch, tmp_path)  # a package folder without weights/
    with pytest.raises(MissingDependencyError, match=r"weights are missing.*distillmos==0\.9\.1"):
        load_naturalness_model.__wrapped__()


@pytest.mark.parametrize("content", ["garbage", "no_model", "wrong_shapes"])
def test_weights_that_do_not_fit_are_a_checkpoint_error(monkeypatch, tmp_path, content):
    path = tmp_path / "weights" / "distill_mos_v7.pt"
    path.parent.mkdir()
    if content == "garbage":
        path.write_bytes(b"not a torch file")
    elif content == "no_model":
        torch.save({"step": 1}, path)
    else:
        state = nat.NaturalnessModel().state_dict()
        state["cnn.cnn.0.weight"] = torch.zeros(32, 2, 3, 3)
        torch.save({"model": state}, path)
    _fake_spec(monkeypatch, tmp_path)
    with pytest.raises(CheckpointError, match="DistillMOS"):
        load_naturalness_model.__wrapped__()
