"""Sample-rate conversion with libsoxr (``soxr``), very-high-quality preset.

The reference resamples prompts with torchaudio's windowed-sinc ``Resample`` (Hann window, lowpass width 6,
rolloff 0.99). soxr VHQ is a better filter (flatter pass band, stronger stop band) and needs no torchaudio, but its
output is not bit-identical: prompt features computed from resampled audio differ slightly from the reference's.
Parity fixtures feed audio already at the target rate, so they are unaffected.
"""

from __future__ import annotations

import numpy as np
import soxr
import torch


def resample(wav: torch.Tensor, orig_sr: int, new_sr: int) -> torch.Tensor:
    """Resample along the last axis. ``wav``: ``[samples]`` or ``[channels, samples]`` -> same rank, float32.

    Output length is ``round(samples * new_sr / orig_sr)`` (soxr's whole-signal length). Returns ``wav`` unchanged
    (as float32) when the rates are equal. Runs on CPU; the result is moved back to ``wav``'s device.
    """
    if orig_sr <= 0 or new_sr <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_sr} -> {new_sr}")
    if wav.dim() not in (1, 2):
        raise ValueError(f"expected [samples] or [channels, samples], got shape {tuple(wav.shape)}")
    wav = wav.to(torch.float32)
    if orig_sr == new_sr:
        return wav
    if wav.shape[-1] == 0:
        return wav.new_zeros(wav.shape[:-1] + (0,))
    # soxr wants [frames, channels] (C-contiguous) float32.
    frames = np.ascontiguousarray(wav.detach().cpu().numpy().T)
    out = soxr.resample(frames, int(orig_sr), int(new_sr), quality="VHQ")
    return torch.from_numpy(np.ascontiguousarray(out.T, dtype=np.float32)).to(wav.device)
