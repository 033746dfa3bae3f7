"""A cheap pitch (f0) track aligned with the 50 Hz mel frames: autocorrelation YIN on the 24 kHz audio.

Not the reference's pyworld harvest + stonemask (not a dependency here), but close enough for a vocoder's f0
regression target on clean speech: YIN's cumulative-mean-normalised difference computed from one FFT
autocorrelation per frame (the energy terms approximated by the frame energy), first dip under ``threshold``,
parabolic refinement. Unvoiced (and silent) frames are 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def yin_f0(
    wav: torch.Tensor,
    sample_rate: int,
    hop: int,
    n_frames: int,
    fmin: float = 60.0,
    fmax: float = 600.0,
    window_s: float = 0.064,
    threshold: float = 0.2,
    silence_rms: float = 1e-3,
) -> torch.Tensor:
    """wav ``[N]`` float at ``sample_rate``; frame ``t`` centred on sample ``t * hop + hop / 2`` -> f0 ``[n_frames]`` Hz.

    ``hop`` is in samples at ``sample_rate`` (480 at 24 kHz for the CosyVoice 2 mel).
    """
    win = int(round(window_s * sample_rate))
    max_lag = min(int(sample_rate / fmin), win // 2)
    min_lag = max(2, int(sample_rate / fmax))
    wav = wav.to(torch.float32).reshape(-1)
    pad = win // 2
    x = F.pad(wav.view(1, 1, -1), (pad, pad + hop * (n_frames + 1)), mode="constant").view(-1)
    centers = torch.arange(n_frames) * hop + hop // 2
    idx = centers[:, None] + torch.arange(win)[None, :]  # frame t covers [centre - win/2, centre + win/2)
    frames = x[idx]
    frames = frames - frames.mean(dim=1, keepdim=True)
    n_fft = 1 << (2 * win - 1).bit_length()
    spec = torch.fft.rfft(frames, n=n_fft)
    acf = torch.fft.irfft(spec.abs() ** 2, n=n_fft)[:, : max_lag + 2]  # [frames, lags]
    energy = acf[:, :1]
    diff = 2 * (energy - acf)  # YIN difference function with both energy terms ~ r(0)
    lags = torch.arange(diff.size(1), dtype=torch.float32)
    cum = torch.cumsum(diff[:, 1:], dim=1) / lags[1:]
    cmnd = torch.ones_like(diff)
    cmnd[:, 1:] = diff[:, 1:] / cum.clamp(min=1e-12)
    rms = (energy[:, 0] / win).clamp(min=0).sqrt()
    search = cmnd[:, min_lag : max_lag + 1].numpy()
    below = search < threshold
    voiced = below.any(axis=1) & (rms > silence_rms).numpy()
    first = below.argmax(axis=1)
    f0 = torch.zeros(n_frames)
    width = search.shape[1]
    for t in voiced.nonzero()[0].tolist():
        row, k = search[t], int(first[t])
        while k + 1 < width and row[k + 1] < row[k]:  # walk to the bottom of the dip
            k += 1
        lag = float(k + min_lag)
        if 0 < k < width - 1:
            a, b, c = float(row[k - 1]), float(row[k]), float(row[k + 1])
            if a - 2 * b + c > 0:
                lag += 0.5 * (a - c) / (a - 2 * b + c)
        f0[t] = sample_rate / lag
    return f0
