"""Neural-source-filter excitation of the HiFT vocoder: f0 -> harmonic source signal.

Reference classes: ``SineGen2`` (the 24 kHz sine generator: phase integrated at the mel-frame rate and linearly
upsampled) and ``SourceModuleHnNSF`` (merges the harmonics with ``Linear(H, 1)`` + tanh).

Randomness (random initial phases and additive Gaussian noise) is drawn by :func:`draw_source_noise` from an
explicit ``torch.Generator`` (never implicitly from torch's global RNG), or given as a :class:`SourceNoise`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.errors import InputError
from cadenza.models.cosyvoice2.config import HiFTConfig

MAX_VOICE_F0 = 1000.0  # Hz: above any speaking voice's fundamental
# Overtones fade out between these fractions of the sample rate (``SineGen2.below_nyquist``).
FADE_FROM, FADE_TO = 0.40, 0.45


@dataclass(frozen=True)
class SourceNoise:
    """The random inputs of one source generation.

    Attributes:
        rand_ini: ``[B, H]`` initial phases in cycles, U[0, 1). Column 0 is ignored (the fundamental starts at phase 0),
            so the raw draw can be passed as it is.
        sine_noise: ``[B, L, H]`` unit normals, scaled per sample by the voiced/unvoiced noise amplitude.
    """

    rand_ini: torch.Tensor
    sine_noise: torch.Tensor


def draw_source_noise(batch: int, length: int, harmonics: int, generator: torch.Generator) -> SourceNoise:
    """Draw the source randomness exactly as the reference draws it from torch's RNG.

    With ``generator = torch.Generator().manual_seed(s)`` this reproduces a reference call made right after
    ``torch.manual_seed(s)`` (on CPU); pass ``torch.default_generator`` to consume the global RNG as the reference does.
    The draws happen on ``generator.device``.

    Order (all three draws matter for the generator state left behind):
    1. ``rand(B, H)`` initial phases;
    2. unit normals for a ``[B, L, H]`` tensor whose memory layout is ``[B, H, L]`` (the reference's
       ``randn_like`` of a transposed view). torch's CPU ``normal_`` uses a scalar Box-Muller path for
       non-contiguous tensors, which gives different values than ``randn(B, L, H)``, so the same layout is used here;
    3. ``randn(B, L, 1)``: the reference's unused noise branch, drawn only to keep the generator in step.
    """
    device = generator.device
    rand_ini = torch.rand(batch, harmonics, generator=generator, device=device)
    sine_noise = torch.empty(batch, harmonics, length, device=device).transpose(1, 2).normal_(generator=generator)
    torch.randn(batch, length, 1, generator=generator, device=device)
    return SourceNoise(rand_ini=rand_ini, sine_noise=sine_noise)


class SineGen2(nn.Module):
    """Harmonic sine generator with frame-rate phase integration (reference ``SineGen2``, non-causal).

    Args:
        cfg: the vocoder config (sample rate, samples per mel frame, harmonics, amplitudes, voicing threshold).
    """

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        self.sampling_rate = cfg.sampling_rate
        self.upsample_scale = cfg.hop_length
        self.num_sines = cfg.nb_harmonics + 1
        self.sine_amp = cfg.nsf_alpha
        self.noise_std = cfg.nsf_sigma
        self.voiced_threshold = cfg.nsf_voiced_threshold
        self.fade_overtones = self.num_sines * MAX_VOICE_F0 > FADE_FROM * self.sampling_rate

    @torch.no_grad()
    def forward(self, f0: torch.Tensor, noise: SourceNoise) -> tuple[torch.Tensor, torch.Tensor]:
        """``f0 [B, L, 1]`` (Hz, sample rate) -> ``(sine_waves [B, L, H], uv [B, L, 1])``."""
        harmonics = torch.arange(1, self.num_sines + 1, dtype=f0.dtype, device=f0.device)
        rad = (f0 * harmonics / self.sampling_rate) % 1  # [B, L, H], cycles per sample
        # The random initial phases land on sample 0, which the frame-rate interpolation below never reads (its
        # first output reads samples 239-240): as in the reference, every overtone starts in phase with the
        # fundamental whatever is drawn, so the source has one waveform shape for a given f0. Kept for parity.
        rand_ini = noise.rand_ini.to(rad).clone()
        rand_ini[:, 0] = 0
        rad[:, 0, :] = rad[:, 0, :] + rand_ini

        # Integrate the phase at the frame rate and interpolate it back up: a per-sample cumsum in float32 over
        # long signals would drift. The scale-factor form of interpolate is kept for bit parity with the reference.
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / self.upsample_scale, mode="linear").transpose(1, 2)
        phase = torch.cumsum(rad, dim=1) * 2 * math.pi
        phase = F.interpolate(phase.transpose(1, 2) * self.upsample_scale, scale_factor=self.upsample_scale,
                              mode="linear").transpose(1, 2)
        sines = torch.sin(phase) * self.sine_amp
        if self.fade_overtones:  # only a source with more sines than the reference's 9 reaches the fade
            sines = sines * self.below_nyquist(f0 * harmonics)

        uv = (f0 > self.voiced_threshold).to(f0.dtype)
        # Unvoiced samples get noise of about the sine amplitude (std = amp / 3), voiced ones a little noise.
        noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
        return sines * uv + noise_amp * noise.sine_noise.to(sines), uv

    def below_nyquist(self, frequency: torch.Tensor) -> torch.Tensor:
        """``[B, L, H]`` gain of each sine at ``frequency`` Hz: 1 up to 0.4 x the sample rate, fading to 0 at 0.45 x.

        A source with more harmonics than the reference's 9 (``nb_harmonics``: harmonics up to a few kHz for a low
        voice, the band a small generator cannot make itself; docs/cadenza-tiny.md) would otherwise fold the
        overtones of a high voice back below Nyquist as inharmonic tones. The reference's 9 reach 0.4 x 24 kHz only
        for an f0 over 1 kHz, past any voice, so ``forward`` leaves its source exactly as it is (``fade_overtones``
        false: no gain computed).
        """
        top, fade = FADE_TO * self.sampling_rate, (FADE_TO - FADE_FROM) * self.sampling_rate
        return ((top - frequency) / fade).clamp(0.0, 1.0)


class SourceModuleHnNSF(nn.Module):
    """Harmonic-plus-noise source: sines of f0 and its overtones merged into one excitation signal.

    Only ``l_linear`` has weights (``m_source.l_linear.*`` in the checkpoint).
    """

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        self.l_sin_gen = SineGen2(cfg)
        self.l_linear = nn.Linear(cfg.nb_harmonics + 1, 1)

    def forward(self, f0: torch.Tensor, noise: SourceNoise) -> torch.Tensor:
        """``f0 [B, L, 1]`` (Hz, upsampled to the sample rate) -> ``source [B, L, 1]`` in (-1, 1)."""
        batch, length, _ = f0.shape
        harmonics = self.l_sin_gen.num_sines
        shapes = (tuple(noise.rand_ini.shape), tuple(noise.sine_noise.shape))
        if shapes != ((batch, harmonics), (batch, length, harmonics)):
            raise InputError(
                f"source noise shapes {shapes[0]}, {shapes[1]} do not fit "
                f"f0 {tuple(f0.shape)}; expected ({batch}, {harmonics}) and ({batch}, {length}, {harmonics})"
            )
        sine_waves, _ = self.l_sin_gen(f0, noise)
        return torch.tanh(self.l_linear(sine_waves))
