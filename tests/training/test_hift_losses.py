"""The vocoder stage's regression losses on signals whose answer is known (harmonic tones, jitter, noise): what
each one sees that the mel loss does not."""

from __future__ import annotations

import math

import pytest
import torch

from cadenza.training.hift.losses import (
    hop_periodic_loss,
    hop_periodic_part,
    instantaneous_frequency_loss,
    multi_resolution_stft_loss,
)
from hift_training_data import SR, harmonic


def test_stft_loss_sees_harmonics_the_mel_loss_blurs():
    """Two 85 Hz voices with the same spectral envelope, one harmonic and one noise-excited: the fine resolution of the
    multi-resolution STFT loss tells them apart far more than the coarse one, and a signal against itself is 0."""
    torch.manual_seed(0)
    n = SR // 2
    voiced = harmonic(torch.full((n,), 85.0), harmonics=40)[None]
    noise = torch.randn(1, n)
    # noise shaped to the voiced signal's coarse envelope (256-point STFT magnitudes, random phase)
    window = torch.hann_window(256)
    env = torch.stft(voiced, 256, 64, 256, window, return_complex=True).abs()
    shaped = torch.istft(env * torch.stft(noise, 256, 64, 256, window, return_complex=True).sgn(), 256, 64, 256,
                         window, length=n)
    assert multi_resolution_stft_loss(voiced, voiced, ((512, 128, 512),)) == 0
    coarse = multi_resolution_stft_loss(voiced, shaped, ((256, 64, 256),))
    fine = multi_resolution_stft_loss(voiced, shaped, ((2048, 512, 2048),))
    assert fine > 1.5 * coarse


def test_periodic_loss_sees_a_buzz_locked_to_the_mel_frames():
    """A voice buzzing at 50 Hz harmonics (it repeats every 480-sample mel hop) against an 85 Hz voice: far from it
    in the periodic loss, while a 95 Hz voice (not locked to the hop) is close; a signal against itself is 0."""
    n = 480 * 20
    voiced = harmonic(torch.full((n,), 85.0), harmonics=40)[None]
    locked = harmonic(torch.full((n,), 50.0), harmonics=60)[None]
    other = harmonic(torch.full((n,), 95.0), harmonics=40)[None]
    part = hop_periodic_part(locked, 480, 6)
    assert torch.allclose(part, locked, atol=1e-3)  # a pure repetition is all "periodic part"
    assert hop_periodic_loss(voiced, voiced, 480, 6) == 0
    assert hop_periodic_loss(voiced, locked, 480, 6) > 2 * hop_periodic_loss(voiced, other, 480, 6)


def test_phase_loss_sees_jitter_and_pitch_errors_more_than_a_phase_offset():
    """The instantaneous-frequency loss is 0 for the real waveform itself, small for the same voice started at
    other harmonic phases, larger for a 2 % pitch error or period-to-period jitter, far larger for noise than for
    the pitch error; it stays
    within [0, 2] and its gradient finite for a silent generator output."""
    sr, n = 24000, 9600
    rng = torch.Generator().manual_seed(0)

    def voice(f0: float, offset: float = 0.0, jitter: float = 0.0) -> torch.Tensor:
        pitch = f0 * (1 + jitter * torch.randn(n, generator=rng, dtype=torch.float64).cumsum(0) / 100)
        phase = 2 * math.pi * torch.cumsum(pitch, 0) / sr
        return sum(torch.sin(k * (phase + offset)) / k for k in range(1, 10))[None].float()

    def loss(fake: torch.Tensor) -> float:
        return float(instantaneous_frequency_loss(real, fake, 1024, 128, sr, 4000.0))

    real = voice(100.0)
    assert loss(real) < 1e-6
    offset, sharp, jittered = loss(voice(100.0, offset=1.3)), loss(voice(102.0)), loss(voice(100.0, jitter=0.2))
    noise = loss(0.3 * torch.randn(1, n, generator=rng))
    assert offset < 0.05 and sharp > 1.5 * offset and jittered > 2 * offset and noise > 3 * sharp
    assert noise <= 2.0
    silent = torch.zeros(1, n, requires_grad=True)
    value = instantaneous_frequency_loss(real, silent, 1024, 128, sr, 4000.0)
    value.backward()
    assert float(value.detach()) == pytest.approx(1.0) and torch.isfinite(silent.grad).all()
