"""Fundamental-frequency (f0) tracking with YIN (de Cheveigné & Kawahara, 2002), torch only.

Used for the f0 targets of HiFT training. The reference uses pyworld's Harvest + StoneMask; pyworld ships only as a
source distribution that needs a C++ toolchain, so this dependency-free tracker stands in. Frame ``t`` is analysed
around sample ``t * hop + hop // 2``, the centre of mel frame ``t`` of ``cadenza.audio.mel.flow_prompt_mel``
(``center=False`` with ``(n_fft - hop) / 2`` reflect padding), so no resampling to the mel length is needed.

Per frame: the squared-difference function ``d(tau)`` over an integration window of ``sample_rate / fmin`` samples
(via FFT), its cumulative-mean normalisation ``d'``, the first local minimum of ``d'`` below ``threshold`` within
``[sample_rate / fmax, sample_rate / fmin]`` refined by parabolic interpolation. Frames without such a dip, or
quieter than ``silence_db`` below the loudest frame, are unvoiced (0 Hz, as Harvest reports them).

Accuracy measured on synthetic 24 kHz signals (checked more loosely in ``tests/training/test_train_hift.py``): steady sines and
11-harmonic tones from 75 to 790 Hz within 0.1 % of the true f0 on every frame (0.02 % up to 600 Hz), a
100 -> 300 Hz/s glide within 0.8 %; white noise and silence come out unvoiced.
"""

from __future__ import annotations

import math

import torch

from cadenza.errors import AudioError


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def yin_f0(wav: torch.Tensor, sample_rate: int, hop: int, n_frames: int | None = None, fmin: float = 70.0,
           fmax: float = 800.0, threshold: float = 0.15, silence_db: float = 45.0) -> torch.Tensor:
    """f0 in Hz per frame (0 = unvoiced) of mono ``wav [samples]``.

    Args:
        sample_rate: of ``wav``.
        hop: samples per frame (480 at 24 kHz: the 50 Hz mel frame rate).
        n_frames: frames to return (default ``samples // hop``, the mel frame count).
        fmin, fmax: search range in Hz.
        threshold: YIN's absolute threshold on the normalised difference (higher: more frames voiced).
        silence_db: frames whose RMS is this many dB below the loudest frame's are unvoiced.

    Returns:
        ``[n_frames]`` float32.
    """
    if wav.dim() != 1:
        raise AudioError(f"yin_f0 expects mono audio [samples], got shape {tuple(wav.shape)}")
    if not 0 < fmin < fmax < sample_rate / 2:
        raise ValueError(f"need 0 < fmin < fmax < sample_rate / 2, got fmin={fmin}, fmax={fmax}")
    wav = wav.to(torch.float32)
    n_frames = wav.shape[0] // hop if n_frames is None else n_frames
    if n_frames <= 0:
        return wav.new_zeros(0)
    max_lag = int(math.ceil(sample_rate / fmin))
    min_lag = max(2, int(math.floor(sample_rate / fmax)))
    width = max_lag  # integration window: one period of the lowest f0
    span = width + max_lag + 1

    # Frames centred on t * hop + hop // 2, moved inside the signal at its ends (zero padding only for audio
    # shorter than one analysis window): a half-empty window would look aperiodic.
    centres = torch.arange(n_frames) * hop + hop // 2
    starts = centres - span // 2
    if wav.shape[0] >= span:
        starts = starts.clamp(0, wav.shape[0] - span)
    pad_left = int(max(0, -int(starts.min())))
    pad_right = int(max(0, int(starts.max()) + span - wav.shape[0]))
    padded = torch.nn.functional.pad(wav, (pad_left, pad_right))
    frames = padded.unfold(0, span, 1)[starts + pad_left]  # [F, span]

    # d(tau) = E(0) + E(tau) - 2 r(tau) over the integration window.
    n_fft = _next_pow2(span + width)
    head = frames[:, :width]
    corr = torch.fft.irfft(torch.fft.rfft(head, n_fft).conj() * torch.fft.rfft(frames, n_fft), n_fft)
    corr = corr[:, : max_lag + 1]
    energy = torch.nn.functional.pad(frames.pow(2).cumsum(1), (1, 0))  # [F, span + 1]
    lags = torch.arange(max_lag + 1)
    window_energy = energy[:, lags + width] - energy[:, lags]  # E(tau)
    diff = (window_energy[:, :1] + window_energy - 2 * corr).clamp(min=0)

    # Cumulative mean normalised difference d'(tau) = d(tau) * tau / sum_{1..tau} d.
    cum = diff[:, 1:].cumsum(1)
    cmnd = torch.ones_like(diff)
    cmnd[:, 1:] = diff[:, 1:] * lags[1:] / cum.clamp(min=1e-12)

    search = cmnd[:, min_lag:max_lag]  # candidate lags min_lag .. max_lag - 1 (each has a right neighbour)
    below = search < threshold
    voiced = below.any(1)
    first = below.float().argmax(1)
    # Walk from the first dip below the threshold to its local minimum.
    rising = torch.nn.functional.pad(search[:, 1:] >= search[:, :-1], (0, 1), value=True)
    after = torch.arange(search.shape[1])[None, :] >= first[:, None]
    best = (rising & after).float().argmax(1) + min_lag  # [F] integer lag

    # Parabolic interpolation of d (unbiased, unlike d') around the minimum.
    rows = torch.arange(n_frames)
    left, mid, right = diff[rows, best - 1], diff[rows, best], diff[rows, best + 1]
    denom = left - 2 * mid + right
    shift = torch.where(denom.abs() > 1e-12, 0.5 * (left - right) / denom, torch.zeros_like(denom)).clamp(-1, 1)
    f0 = sample_rate / (best.float() + shift)

    rms = head.pow(2).mean(1).sqrt()
    loud = 20 * torch.log10(rms.clamp(min=1e-10) / rms.max().clamp(min=1e-10)) > -silence_db
    return torch.where(voiced & loud & (rms > 1e-6), f0, torch.zeros_like(f0))


def fill_f0_gaps(f0: torch.Tensor, max_gap: int) -> torch.Tensor:
    """``f0 [frames]`` (0 = unvoiced) with every unvoiced run of at most ``max_gap`` frames that has voiced frames on
    both sides filled by log-linear interpolation between them (a tracker's dropouts inside a voiced stretch: YIN
    misses single frames of a breathy or creaky voice). Runs at the ends and longer runs stay unvoiced."""
    if max_gap <= 0 or f0.numel() == 0:
        return f0
    out = f0.clone()
    voiced = (f0 > 0).tolist()
    i, n = 0, len(voiced)
    while i < n:
        if voiced[i]:
            i += 1
            continue
        j = i
        while j < n and not voiced[j]:
            j += 1
        if 0 < i and j < n and j - i <= max_gap:
            lo, hi = math.log(float(f0[i - 1])), math.log(float(f0[j]))
            steps = torch.arange(1, j - i + 1, dtype=torch.float32) / (j - i + 1)
            out[i:j] = torch.exp(lo + (hi - lo) * steps).to(out.dtype)
        i = j
    return out
