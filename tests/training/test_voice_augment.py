"""Voice augmentation for the frame tokenizer (cadenza.training.voice_augment): unchanged when nothing is drawn,
pitch moves the harmonics and not the envelope, formants move the envelope and not the harmonics, tempo shortens
the features and the labels alike, noise lowers the SNR; the config is validated; a stage with it on augments only
its training items."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cadenza.audio.whisper_mel import whisper_log_mel, whisper_power
from cadenza.errors import InputError
from cadenza.training.config import dataclass_from_dict
from cadenza.training.voice_augment import (
    VoiceAugmentConfig,
    VoiceDraw,
    augmented_log_mel,
    draw,
    stretch_labels,
    warp_envelope,
)

SR = 16000
BIN_HZ = 40.0  # whisper's STFT: 400 points at 16 kHz


def _vowel(f0: float, formant_hz: float, seconds: float = 1.0) -> torch.Tensor:
    """Harmonics of ``f0`` shaped by one resonance at ``formant_hz`` (a crude vowel)."""
    t = np.arange(int(seconds * SR)) / SR
    wav = sum(math.exp(-((k * f0 - formant_hz) / 900.0) ** 2) * np.sin(2 * math.pi * k * f0 * t)
              for k in range(1, int(4000 / f0)))
    return torch.from_numpy((0.3 * wav / np.abs(wav).max()).astype(np.float32))


def _mean_power(wav: torch.Tensor) -> np.ndarray:
    return whisper_power(wav)[0, :, 5:-5].mean(dim=1).numpy()


def _envelope_peak_hz(power: np.ndarray) -> float:
    smooth = np.convolve(np.log(power + 1e-10), np.ones(15) / 15, mode="same")
    return float(np.argmax(smooth[5:-5]) + 5) * BIN_HZ


def _harmonic_spacing_hz(power: np.ndarray) -> float:
    """The f0 of a harmonic spectrum: the lag (80-600 Hz) at which the fine structure of the log spectrum (the
    envelope removed) repeats best, refined by a parabola through the peak."""
    log_p = np.log(power + 1e-10)
    fine = log_p - np.convolve(log_p, np.ones(9) / 9, mode="same")
    fine = fine[10:100] - fine[10:100].mean()  # 400 Hz - 4 kHz
    lags = np.arange(2, 16)
    r = np.array([np.dot(fine[:-k], fine[k:]) / np.dot(fine, fine) for k in lags])
    i = int(np.argmax(r))
    shift = 0.0
    if 0 < i < len(r) - 1:
        shift = 0.5 * (r[i - 1] - r[i + 1]) / (r[i - 1] - 2 * r[i] + r[i + 1])
    return float(lags[i] + shift) * BIN_HZ


def test_nothing_drawn_is_whisper_log_mel_itself():
    wav = _vowel(120.0, 700.0)
    rng = np.random.default_rng(0)
    assert torch.equal(augmented_log_mel(wav, VoiceDraw(), 128, rng), whisper_log_mel(wav)[0])
    assert draw(VoiceAugmentConfig(), rng) is None  # probability 0: off
    cfg = VoiceAugmentConfig(probability=0.5, pitch=(1.2, 1.2))
    draws = [draw(cfg, rng) for _ in range(400)]
    assert 0.4 < sum(d is not None for d in draws) / 400 < 0.6
    assert all(d.pitch == pytest.approx(1.2) for d in draws if d is not None)


def test_pitch_moves_the_harmonics_and_not_the_envelope():
    from cadenza.audio.resample import resample
    from cadenza.audio.time_scale import time_scale

    wav = _vowel(200.0, 1200.0)
    power = _mean_power(wav)
    # The steps of augmented_log_mel on the power spectrum: WSOLA by p, resampling by p, the envelope moved back.
    up = resample(torch.from_numpy(time_scale(wav.numpy(), 1 / 1.6, SR, "wsola")), round(SR * 1.6), SR)
    moved = warp_envelope(whisper_power(up)[0], 1 / 1.6)[:, 5:-5].mean(dim=1).numpy()
    assert _harmonic_spacing_hz(power) == pytest.approx(200.0, abs=15)
    assert _harmonic_spacing_hz(moved) == pytest.approx(320.0, abs=25)  # pitch x 1.6
    assert _envelope_peak_hz(moved) == pytest.approx(_envelope_peak_hz(power), abs=4 * BIN_HZ)  # formant kept
    mel = augmented_log_mel(wav, VoiceDraw(pitch=1.6), 128, np.random.default_rng(0))
    assert mel.shape == whisper_log_mel(wav)[0].shape  # same tempo: same frames


def test_formant_moves_the_envelope_and_not_the_harmonics():
    wav = _vowel(200.0, 1200.0)
    power = whisper_power(wav)[0]
    moved = warp_envelope(power, 1.25)[:, 5:-5].mean(dim=1).numpy()
    base = power[:, 5:-5].mean(dim=1).numpy()
    assert _envelope_peak_hz(moved) == pytest.approx(1.25 * _envelope_peak_hz(base), abs=4 * BIN_HZ)
    assert _harmonic_spacing_hz(moved) == pytest.approx(_harmonic_spacing_hz(base), abs=15)


def test_tempo_shortens_features_and_labels_alike_and_noise_lowers_the_snr():
    wav = _vowel(120.0, 700.0, seconds=2.0)
    rng = np.random.default_rng(0)
    fast = augmented_log_mel(wav, VoiceDraw(tempo=1.25), 128, rng)
    assert fast.shape[-1] == pytest.approx(200 / 1.25, abs=2)
    labels = torch.arange(50)
    short = stretch_labels(labels, 40)
    assert short.numel() == 40 and short[0] == 0 and short[-1] == 49 and bool((short.diff() >= 0).all())
    assert torch.equal(stretch_labels(labels, 50), labels)
    clean = augmented_log_mel(wav, VoiceDraw(), 128, rng)
    noisy = augmented_log_mel(wav, VoiceDraw(noise_snr_db=10.0), 128, rng)
    # Noise fills the gaps between harmonics: the quietest mel bins rise.
    assert float(noisy.quantile(0.1)) > float(clean.quantile(0.1)) + 0.2


@pytest.mark.parametrize("bad", [{"probability": 1.5}, {"pitch": [2.0, 1.0]}, {"pitch": [0.2, 1.0]},
                                 {"formant": [1.0, 2.0]}, {"tempo": [0.5, 1.0]}, {"noise_snr_db": [-5, 10]},
                                 {"pitchh": [1, 2]}])
def test_bad_config_is_refused(bad):
    with pytest.raises(InputError):
        dataclass_from_dict(VoiceAugmentConfig, bad, "frame_tokenizer.augment")
