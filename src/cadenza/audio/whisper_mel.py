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


def whisper_power(wav: torch.Tensor, sample_rate: int = WHISPER_SAMPLE_RATE) -> torch.Tensor:
    """The power spectrum whisper's mel is taken of: ``[batch, 201, samples // hop]`` float32 (40 Hz bins).

    ``sample_rate`` other than 16 kHz (a multiple of 200 Hz, at least 16 kHz) takes the same analysis without
    resampling: a 25 ms window every 10 ms gives 40 Hz bins at any rate, so bins 0-200 (0-8 kHz) are whisper's
    frequencies; the power is scaled by ``(400 / n_fft)^2`` so the window's gain matches. It differs from resampling
    to 16 kHz first only by what a resampler's anti-alias filter would remove above 8 kHz and by leakage across
    8 kHz, and stays differentiable (a vocoder's training loss reads its 24 kHz output this way).
    """
    if wav.dim() == 1:
        wav = wav.unsqueeze(0)
    if wav.dim() != 2:
        raise AudioError(f"expected audio [samples] or [batch, samples], got shape {tuple(wav.shape)}")
    if sample_rate < WHISPER_SAMPLE_RATE or sample_rate % 200:  # whole-sample window (rate / 40) and hop (/ 100)
        raise AudioError(f"whisper's analysis needs a sample rate of at least {WHISPER_SAMPLE_RATE} Hz and a "
                         f"multiple of 200 Hz, got {sample_rate}")
    n_fft = WHISPER_N_FFT * sample_rate // WHISPER_SAMPLE_RATE
    hop = WHISPER_HOP * sample_rate // WHISPER_SAMPLE_RATE
    if wav.shape[-1] <= n_fft // 2:
        raise AudioError(
            f"audio too short for the speech tokenizer: {wav.shape[-1]} samples, need more than {n_fft // 2}"
        )
    wav = wav.to(torch.float32)
    window = torch.hann_window(n_fft, dtype=torch.float32, device=wav.device)
    spec = torch.stft(wav, n_fft, hop, window=window, return_complex=True)  # center=True, reflect
    # The last (centred past-the-end) frame is dropped, as whisper does.
    power = spec[:, : WHISPER_N_FFT // 2 + 1, :-1].abs() ** 2  # [batch, 201, frames]
    return power if n_fft == WHISPER_N_FFT else power * (WHISPER_N_FFT / n_fft) ** 2


def whisper_log_mel_from_power(power: torch.Tensor, n_mels: int = 128) -> torch.Tensor:
    """``power [batch, 201, frames]`` (``whisper_power``) -> whisper's log-mel ``[batch, n_mels, frames]``."""
    return whisper_scaled_log_mel(whisper_log10_mel(power, n_mels))


def whisper_log10_mel(power: torch.Tensor, n_mels: int = 128) -> torch.Tensor:
    """``power [batch, 201, frames]`` -> ``log10(max(mel, 1e-10))`` ``[batch, n_mels, frames]``: whisper's log-mel
    before its dynamic-range limit and scaling."""
    bank = slaney_mel_filterbank(WHISPER_SAMPLE_RATE, WHISPER_N_FFT, n_mels).to(power.device)
    return torch.clamp(bank @ power, min=LOG10_FLOOR).log10()


def whisper_scaled_log_mel(log10_mel: torch.Tensor, ceiling: torch.Tensor | None = None) -> torch.Tensor:
    """Whisper's last two steps on ``whisper_log10_mel``: values more than 8 decades under ``ceiling`` raised to it
    (default: each utterance's own maximum, ``[batch, 1, 1]``), then ``(x + 4) / 4``. A given ``ceiling`` lets two
    signals share one floor (a vocoder's output read against its target's)."""
    if ceiling is None:
        ceiling = log10_mel.amax(dim=(-2, -1), keepdim=True)
    return (torch.maximum(log10_mel, ceiling - DYNAMIC_RANGE_DECADES) + 4.0) / 4.0
