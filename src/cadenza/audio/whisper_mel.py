"""The speech tokenizer's input: ``whisper.log_mel_spectrogram(wav16k, n_mels=128)`` (docs/design.md, "Audio features").

Whisper's front end is fixed (16 kHz, 25 ms / 10 ms), so its constants live here rather than in a config:
STFT n_fft 400, hop 160, periodic Hann, ``center=True`` (reflect pad 200), power spectrum with the last frame dropped,
Slaney mel bank (identical to whisper's bundled ``mel_filters.npz``), ``log10(max(x, 1e-10))``, dynamic range
limited to 8 decades below the maximum, then ``(x + 4) / 4``.
"""

from __future__ import annotations

import torch

from cadenza.audio.filterbanks import slaney_mel_filterbank
from cadenza.errors import AudioError

WHISPER_SAMPLE_RATE = 16000
WHISPER_N_FFT = 400
WHISPER_HOP = 160
LOG10_FLOOR = 1e-10
DYNAMIC_RANGE_DECADES = 8.0


def whisper_log_mel(wav16k: torch.Tensor, n_mels: int = 128) -> torch.Tensor:
    """Whisper log-mel of ``wav16k`` (``[samples]`` or ``[batch, samples]``, float in [-1, 1] at 16 kHz).

    Returns ``[batch, n_mels, samples // 160]`` float32 (batch 1 for 1-D input).
    The 8-decade clamp uses the maximum of each utterance. Whisper takes the maximum over the whole tensor, which
    for a batch would let one loud utterance change another's features; for batch 1 the two are identical.
    """
    return whisper_log_mel_from_power(whisper_power(wav16k), n_mels)


def whisper_power(wav16k: torch.Tensor) -> torch.Tensor:
    """The power spectrum whisper's mel is taken of: ``[batch, 201, samples // 160]`` float32 (40 Hz bins)."""
    if wav16k.dim() == 1:
        wav16k = wav16k.unsqueeze(0)
    if wav16k.dim() != 2:
        raise AudioError(f"expected audio [samples] or [batch, samples], got shape {tuple(wav16k.shape)}")
    if wav16k.shape[-1] <= WHISPER_N_FFT // 2:
        raise AudioError(
            f"audio too short for the speech tokenizer: {wav16k.shape[-1]} samples, need more than {WHISPER_N_FFT // 2}"
        )
    wav16k = wav16k.to(torch.float32)
    window = torch.hann_window(WHISPER_N_FFT, dtype=torch.float32, device=wav16k.device)
    spec = torch.stft(wav16k, WHISPER_N_FFT, WHISPER_HOP, window=window, return_complex=True)  # center=True, reflect
    return spec[..., :-1].abs() ** 2  # [batch, 201, frames]; the last (centred past-the-end) frame is dropped


def whisper_log_mel_from_power(power: torch.Tensor, n_mels: int = 128) -> torch.Tensor:
    """``power [batch, 201, frames]`` (``whisper_power``) -> whisper's log-mel ``[batch, n_mels, frames]``."""
    bank = slaney_mel_filterbank(WHISPER_SAMPLE_RATE, WHISPER_N_FFT, n_mels).to(power.device)
    log_spec = torch.clamp(bank @ power, min=LOG10_FLOOR).log10()  # [batch, n_mels, frames]
    ceiling = log_spec.amax(dim=(-2, -1), keepdim=True)
    log_spec = torch.maximum(log_spec, ceiling - DYNAMIC_RANGE_DECADES)
    return (log_spec + 4.0) / 4.0
