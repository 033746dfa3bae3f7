"""Time-stretching a sequence of feature frames (e.g. a mel spectrogram) by linear interpolation, chunk by chunk.

CosyVoice 2 changes its speaking rate in the mel domain: the flow's mel is stretched to ``frames / speed`` frames
before the vocoder, which rebuilds the waveform (and its pitch, from the spectral frames) at the new length; so the
rate changes and the pitch does not (docs/controls.md, "Speed"). The reference does it on a whole utterance with
``F.interpolate(mode="linear")``. ``FrameStretch`` does the same on frames that arrive in chunks: output frame ``j``
reads the input at ``(j + 0.5) * speed - 0.5`` (``align_corners=False``'s mapping, with the scale fixed to ``speed``
since the final length is not known yet), so it needs at most one input frame past the ones it interpolates: a
chunk's output is ready as soon as its input is, at most one frame held back for the next chunk.
"""

from __future__ import annotations

import torch

from cadenza.audio.speed_range import speed_in_range


class FrameStretch:
    """Streaming linear time-stretch of frames ``[B, C, T]`` along T by ``1 / speed``; one per stream.

    ``push(frames)`` returns the output frames whose inputs have arrived; ``finish()`` the rest, so that all outputs
    together have ``int(T_total / speed)`` frames (as ``F.interpolate(size=int(T / speed))``).
    """

    def __init__(self, speed: float) -> None:
        self.speed = speed_in_range(speed)
        self._buf: torch.Tensor | None = None  # input frames [base, n_in)
        self._base = 0  # absolute index of _buf's first frame
        self._n_in = 0  # input frames received
        self._next = 0  # next output frame
        self._finished = False

    def _source(self, j: torch.Tensor) -> torch.Tensor:
        """Input position (float64) of output frames ``j``."""
        return ((j.double() + 0.5) * self.speed - 0.5).clamp(min=0.0)

    def _emit(self, stop: int) -> torch.Tensor:
        """Output frames ``[_next, stop)`` from the buffer; drops input frames no later output needs."""
        buf = self._buf
        if stop <= self._next:
            return buf[:, :, :0]
        j = torch.arange(self._next, stop)
        src = self._source(j)
        left = src.floor().long()
        weight = (src - left.double()).to(buf.dtype)
        right = (left + 1).clamp(max=self._n_in - 1)
        out = buf[:, :, left - self._base] * (1 - weight) + buf[:, :, right - self._base] * weight
        self._next = stop
        keep = min(int(self._source(torch.tensor([stop]))[0].floor()), self._n_in - 1)
        self._buf, self._base = buf[:, :, keep - self._base:], keep
        return out

    def push(self, frames: torch.Tensor) -> torch.Tensor:
        """frames ``[B, C, n]`` -> the stretched frames ready now ``[B, C, m]``."""
        if self._finished:
            raise ValueError("this FrameStretch is finished")
        self._buf = frames if self._buf is None else torch.cat([self._buf, frames], dim=2)
        self._n_in += frames.size(2)
        if self._n_in < 2:
            return self._buf[:, :, :0]
        # Output j is ready once both frames around its source position exist: source < n_in - 1.
        stop = int((self._n_in - 0.5) / self.speed + 0.5) + 1
        while stop > self._next and float(self._source(torch.tensor([stop - 1]))[0]) >= self._n_in - 1:
            stop -= 1
        return self._emit(max(stop, self._next))

    def finish(self) -> torch.Tensor:
        """The remaining output frames (the last input frame repeated past the end, as ``F.interpolate`` clamps)."""
        self._finished = True
        if self._buf is None:
            raise ValueError("FrameStretch.finish() before any frames")
        return self._emit(max(self._next, int(self._n_in / self.speed)))
