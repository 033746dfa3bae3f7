"""The flow's speaking rate (``speed_method="flow"``, docs/controls.md "Speed"): the encoder's ``mu`` resampled.

The encoder gives ``ratio`` frames of ``mu`` per speech token; at ``speed`` s the estimator instead renders the
spoken part at ``1 / s`` as many frames, each reading ``mu`` by linear interpolation at
``fixed + (j + 0.5) * s - 0.5`` (``j``: the frame's index after the ``fixed`` prompt frames, which keep their own
rate: the prompt's mel is the condition there). That is ``F.interpolate(mode="linear")``'s mapping with the scale
fixed to ``s`` (the final length is unknown while streaming), the same resampling a flow trained on speaking-rate
pairs has learnt (``training/flow_objective.py``), so a frame depends on two ``mu`` frames only and a stream can
emit its frames as soon as their ``mu`` exists, whole or in chunks, with the same result.
"""

from __future__ import annotations

import math

import torch

from cadenza.audio.speed_range import speed_in_range


class FrameRate:
    """Positions of the estimator's frames in ``mu`` at ``speed``; frames before ``fixed`` map to themselves."""

    def __init__(self, speed: float, fixed: int) -> None:
        if fixed < 0:
            raise ValueError(f"fixed frames must be >= 0, got {fixed}")
        self.speed, self.fixed = speed_in_range(speed), int(fixed)

    def source(self, frames: torch.Tensor) -> torch.Tensor:
        """Output frame indices ``[n]`` -> their (float64) positions in ``mu``."""
        j = frames.double() - self.fixed
        spoken = self.fixed + ((j + 0.5) * self.speed - 0.5).clamp(min=0.0)
        return torch.where(j < 0, frames.double(), spoken)

    def _at(self, frame: int) -> float:
        return float(self.source(torch.tensor([frame]))[0])

    def total(self, mu_frames: int) -> int:
        """Output frames of a whole utterance whose ``mu`` has ``mu_frames`` frames (``fixed`` included)."""
        if mu_frames <= self.fixed:
            return mu_frames
        return self.fixed + int((mu_frames - self.fixed) / self.speed)

    def ready(self, mu_frames: int) -> int:
        """Output frames computable from the first ``mu_frames`` frames of ``mu`` while more will follow: those whose
        position is at most ``mu_frames - 1`` (both neighbours they blend exist)."""
        if mu_frames <= self.fixed:
            return mu_frames
        n = self.fixed + int(math.floor((mu_frames - 1 - self.fixed + 0.5) / self.speed - 0.5)) + 1
        n = max(n, self.fixed)
        while n > self.fixed and self._at(n - 1) > mu_frames - 1:  # float round-off at the edge
            n -= 1
        while self._at(n) <= mu_frames - 1:
            n += 1
        return n

    def frames(self, mu_frames: int, final: bool) -> int:
        """``total`` when ``mu`` is complete (``final``), else ``ready``."""
        return self.total(mu_frames) if final else self.ready(mu_frames)

    def first_needed(self, frame: int) -> int:
        """The first ``mu`` frame output frame ``frame`` (and every later one) reads."""
        return int(math.floor(self._at(frame)))

    def resample(self, mu: torch.Tensor, base: int, start: int, stop: int, mu_end: int) -> torch.Tensor:
        """Output frames ``[start, stop)`` from ``mu [B, C, n]``, which holds ``mu`` frames ``[base, base + n)``;
        ``mu_end``: frames of ``mu`` that exist in all (positions past the last one read it, as
        ``F.interpolate`` clamps at the end)."""
        if stop <= start:
            return mu[:, :, :0]
        src = self.source(torch.arange(start, stop)).clamp(max=mu_end - 1)
        left = src.floor().long()
        weight = (src - left.double()).to(mu.dtype)
        right = (left + 1).clamp(max=mu_end - 1)
        if int(left[0]) < base or int(right[-1]) >= base + mu.size(2):
            raise ValueError(f"frames [{start}, {stop}) need mu frames [{int(left[0])}, {int(right[-1])}], "
                             f"given [{base}, {base + mu.size(2)})")
        return mu[:, :, left - base] * (1 - weight) + mu[:, :, right - base] * weight
