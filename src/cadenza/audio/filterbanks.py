"""Mel filterbanks: librosa's Slaney-style bank (flow prompt mel, whisper) and Kaldi's bank (CAM++ fbank).

Both are re-derived here so that neither librosa nor torchaudio is needed at run time. Banks are cached per
full parameter set (the reference's matcha code keys its cache by ``fmax`` and device only, so two extractors with
different ``n_fft`` would silently share a bank; we key by every argument).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

# Slaney mel scale (librosa ``hz_to_mel(htk=False)``): linear below 1 kHz, logarithmic above.
_SLANEY_F_SP = 200.0 / 3
_SLANEY_MIN_LOG_HZ = 1000.0
_SLANEY_MIN_LOG_MEL = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP
_SLANEY_LOGSTEP = math.log(6.4) / 27.0


def _hz_to_slaney_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / _SLANEY_F_SP
    log_region = hz >= _SLANEY_MIN_LOG_HZ
    safe_hz = np.where(log_region, hz, _SLANEY_MIN_LOG_HZ)  # avoid log(0) warnings in the linear region
    return np.where(log_region, _SLANEY_MIN_LOG_MEL + np.log(safe_hz / _SLANEY_MIN_LOG_HZ) / _SLANEY_LOGSTEP, mel)


def _slaney_mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    hz = _SLANEY_F_SP * mel
    log_region = mel >= _SLANEY_MIN_LOG_MEL
    return np.where(log_region, _SLANEY_MIN_LOG_HZ * np.exp(_SLANEY_LOGSTEP * (mel - _SLANEY_MIN_LOG_MEL)), hz)


@lru_cache(maxsize=16)
def _slaney_bank_numpy(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float | None) -> np.ndarray:
    fmax = sr / 2.0 if fmax is None else float(fmax)
    fft_freqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)  # [n_fft//2 + 1], float64
    mel_edges = np.linspace(_hz_to_slaney_mel(fmin), _hz_to_slaney_mel(fmax), n_mels + 2)
    hz_edges = _slaney_mel_to_hz(mel_edges)  # [n_mels + 2]
    widths = np.diff(hz_edges)
    ramps = hz_edges[:, None] - fft_freqs[None, :]  # [n_mels + 2, n_bins]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    # librosa writes each triangle into a float32 array, then multiplies in place by the float64 area norm:
    # round to float32 twice, exactly as it does, to match its bank bit for bit.
    weights = np.maximum(0.0, np.minimum(lower, upper)).astype(np.float32)
    area_norm = 2.0 / (hz_edges[2:] - hz_edges[:-2])
    return (weights.astype(np.float64) * area_norm[:, None]).astype(np.float32)


def slaney_mel_filterbank(
    sr: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> torch.Tensor:
    """librosa 0.10 ``filters.mel(sr, n_fft, n_mels, fmin, fmax, htk=False, norm='slaney')`` as float32.

    Returns ``[n_mels, n_fft // 2 + 1]``; apply as ``bank @ spectrum``. ``fmax=None`` means ``sr / 2``.
    The triangles are computed in float64 (like librosa) and stored as float32. The returned tensor is shared by
    callers (cached), so treat it as read-only.
    """
    return torch.from_numpy(_slaney_bank_numpy(int(sr), int(n_fft), int(n_mels), float(fmin), fmax))


def _kaldi_mel(hz: torch.Tensor | float) -> torch.Tensor | float:
    """Kaldi/HTK mel scale ``1127 ln(1 + f/700)``."""
    if isinstance(hz, torch.Tensor):
        return 1127.0 * (1.0 + hz / 700.0).log()
    return 1127.0 * math.log(1.0 + hz / 700.0)


@lru_cache(maxsize=16)
def _kaldi_bank(num_bins: int, padded_window_size: int, sample_frequency: float, low_freq: float, high_freq: float):
    if num_bins <= 3:
        raise ValueError(f"Kaldi mel banks need more than 3 bins, got {num_bins}")
    if padded_window_size % 2:
        raise ValueError(f"the padded FFT window must be even, got {padded_window_size}")
    nyquist = 0.5 * sample_frequency
    if high_freq <= 0.0:  # Kaldi convention: non-positive high_freq is an offset from Nyquist
        high_freq += nyquist
    if not 0.0 <= low_freq < high_freq <= nyquist:
        raise ValueError(f"need 0 <= low_freq < high_freq <= Nyquist ({nyquist}), got {low_freq}, {high_freq}")
    fft_bin_width = sample_frequency / padded_window_size
    mel_low = _kaldi_mel(low_freq)
    mel_delta = (_kaldi_mel(high_freq) - mel_low) / (num_bins + 1)
    # Same float32 op order as torchaudio.compliance.kaldi.get_mel_banks (so the bank matches it to the last bit).
    bin_index = torch.arange(num_bins).unsqueeze(1)
    left_mel = mel_low + bin_index * mel_delta  # [num_bins, 1]
    center_mel = mel_low + (bin_index + 1.0) * mel_delta
    right_mel = mel_low + (bin_index + 2.0) * mel_delta
    fft_mel = _kaldi_mel(fft_bin_width * torch.arange(padded_window_size // 2, dtype=torch.float32)).unsqueeze(0)
    up_slope = (fft_mel - left_mel) / (center_mel - left_mel)
    down_slope = (right_mel - fft_mel) / (right_mel - center_mel)
    bank = torch.clamp(torch.minimum(up_slope, down_slope), min=0.0)  # [num_bins, padded // 2]
    # The Nyquist bin never gets weight in Kaldi; append it as zeros so the bank spans the full rfft output.
    return torch.nn.functional.pad(bank, (0, 1))


def kaldi_mel_banks(
    num_bins: int, padded_window_size: int, sample_frequency: float, low_freq: float = 20.0, high_freq: float = 0.0
) -> torch.Tensor:
    """Kaldi's triangular mel banks (``torchaudio.compliance.kaldi.get_mel_banks`` without VTLN), float32.

    Returns ``[num_bins, padded_window_size // 2 + 1]`` (the last column, Nyquist, is zero); apply as
    ``power_spectrum @ bank.T``. Triangles are equally spaced on the mel scale ``1127 ln(1 + f/700)`` between
    ``low_freq`` and ``high_freq`` (``high_freq <= 0`` means Nyquist + high_freq), and are not area-normalised.
    The returned tensor is cached and shared, so treat it as read-only.
    """
    return _kaldi_bank(
        int(num_bins), int(padded_window_size), float(sample_frequency), float(low_freq), float(high_freq)
    )
