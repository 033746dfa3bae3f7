"""The flow's prompt mel: matcha-TTS ``mel_spectrogram``, natural-log Slaney mel at 24 kHz.

See docs/design.md, "Audio features".

Pipeline: reflect-pad ``(n_fft - hop) / 2`` on both sides -> STFT (periodic Hann, ``center`` from the config,
False for CosyVoice 2) -> magnitude ``sqrt(re^2 + im^2 + 1e-9)`` -> Slaney mel bank -> ``log(max(x, 1e-5))``.
With ``center=False`` this gives ``samples // hop`` frames, frame ``t`` centred on sample ``t * hop + hop / 2``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from cadenza.audio.filterbanks import slaney_mel_filterbank
from cadenza.errors import AudioError


class MelConfig(Protocol):
    """The mel's settings, as a model config states them (``cadenza.models.cosyvoice2.config.MelConfig`` is one;
    this package does not depend on the models')."""

    n_fft: int
    num_mels: int
    sampling_rate: int
    hop_size: int
    win_size: int
    fmin: float
    fmax: float | None
    center: bool

# Added under the square root so that the gradient of the magnitude is finite at zero (matcha's choice; kept for parity).
MAGNITUDE_EPS = 1e-9
# Log floor: -11.5 in natural log, about -100 dB re full-scale amplitude.
LOG_FLOOR = 1e-5


def flow_prompt_mel(wav: torch.Tensor, cfg: MelConfig) -> torch.Tensor:
    """Log-mel of ``wav`` (``[samples]`` or ``[batch, samples]``, float in [-1, 1] at ``cfg.sampling_rate``).

    Returns ``[batch, cfg.num_mels, frames]`` float32 (batch 1 for 1-D input); ``frames = samples // cfg.hop_size``
    when ``cfg.center`` is False. The CosyVoice 2 frontend transposes this to ``[batch, frames, num_mels]``.
    """
    if wav.dim() == 1:
        wav = wav.unsqueeze(0)
    if wav.dim() != 2:
        raise AudioError(f"expected audio [samples] or [batch, samples], got shape {tuple(wav.shape)}")
    pad = (cfg.n_fft - cfg.hop_size) // 2
    if wav.shape[-1] <= pad:
        raise AudioError(
            f"audio too short for the prompt mel: {wav.shape[-1]} samples, need more than {pad} "
            f"({pad / cfg.sampling_rate * 1000:.0f} ms)"
        )
    wav = wav.to(torch.float32)
    padded = torch.nn.functional.pad(wav.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    window = torch.hann_window(cfg.win_size, dtype=torch.float32, device=wav.device)
    spec = torch.stft(
        padded,
        cfg.n_fft,
        hop_length=cfg.hop_size,
        win_length=cfg.win_size,
        window=window,
        center=cfg.center,
        pad_mode="reflect",
        normalized=False,
        onesided=True,
        return_complex=True,
    )  # [batch, n_fft // 2 + 1, frames]
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + MAGNITUDE_EPS)
    bank = slaney_mel_filterbank(cfg.sampling_rate, cfg.n_fft, cfg.num_mels, cfg.fmin, cfg.fmax).to(wav.device)
    mel = torch.matmul(bank, magnitude)  # [batch, num_mels, frames]
    return torch.log(torch.clamp(mel, min=LOG_FLOOR))
