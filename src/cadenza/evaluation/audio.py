"""Audio for the evaluators: both want 16 kHz mono float32 numpy arrays."""

from __future__ import annotations

import os

import numpy as np
import torch

from cadenza.audio.io import load_audio
from cadenza.audio.resample import resample
from cadenza.errors import AudioError

EVAL_SR = 16_000


def to_16k_mono(wav: np.ndarray | torch.Tensor, sr: int) -> np.ndarray:
    """``wav``: ``[samples]``, or ``[channels, samples]`` / ``[samples, channels]`` (averaged over the shorter
    axis) at ``sr`` Hz -> ``[samples']`` float32 at 16 kHz."""
    x = torch.as_tensor(np.asarray(wav, dtype=np.float32)) if not isinstance(wav, torch.Tensor) else wav.float()
    if x.dim() == 2:
        x = x.mean(dim=int(x.shape[0] > x.shape[1]))
    if x.dim() != 1:
        raise AudioError(f"expected mono or [channels, samples] audio, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise AudioError("the audio is empty")
    return resample(x.detach().cpu(), int(sr), EVAL_SR).numpy()


def load_16k(path: str | os.PathLike) -> np.ndarray:
    """Read any audio file libsndfile decodes -> 16 kHz mono float32 (``AudioError`` if unreadable)."""
    return load_audio(path, EVAL_SR).numpy()
