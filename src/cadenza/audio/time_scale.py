"""Pitch-preserving time-scale of audio, whole or streamed: the speaking rate changed on the waveform.

Two methods, both streaming with a bounded look-ahead and both giving ``round(n / speed)`` samples:
``"phase_vocoder"`` (``audio/phase_vocoder.py``) and ``"wsola"`` (``audio/wsola.py``). ``"auto"`` (the default)
takes the one that kept the most words at that rate: the phase vocoder to speed up, WSOLA to slow down (the phase
vocoder's slowed speech sounds phasey and lost words: docs/controls.md, "Speed", has the measurements).
"""

from __future__ import annotations

import numpy as np

from cadenza.audio.phase_vocoder import PhaseVocoder
from cadenza.audio.wsola import Wsola

ALGORITHMS = ("phase_vocoder", "wsola")
TIME_SCALE_METHODS = ("auto", *ALGORITHMS)


def method_for(speed: float, method: str = "auto") -> str:
    """The algorithm ``method`` means at ``speed``: ``"auto"`` is the phase vocoder above speed 1, WSOLA below."""
    if method not in TIME_SCALE_METHODS:
        raise ValueError(f"time-scale method must be one of {', '.join(TIME_SCALE_METHODS)}, not {method!r}")
    if method == "auto":
        return "phase_vocoder" if speed > 1.0 else "wsola"
    return method


def time_scaler(speed: float, sample_rate: int, method: str = "auto") -> PhaseVocoder | Wsola:
    """A streaming time-scaler (``push(chunk)`` / ``finish()``) for one stream."""
    algorithm = method_for(speed, method)
    return PhaseVocoder(speed, sample_rate) if algorithm == "phase_vocoder" else Wsola(speed, sample_rate)


def time_scale(audio: np.ndarray, speed: float, sample_rate: int, method: str = "auto") -> np.ndarray:
    """Whole-signal time-scale: float32 ``round(len / speed)`` samples, same pitch (the same samples as streaming
    the audio through ``time_scaler`` in pieces)."""
    stretch = time_scaler(speed, sample_rate, method)
    return np.concatenate([stretch.push(audio), stretch.finish()])


class TimeScaledChunks:
    """A stream of audio chunks (an engine's ``ChunkStream``: iterable, ``cancel()``) time-scaled by
    ``time_scaler``; ``cancel`` passes through."""

    def __init__(self, chunks, speed: float, sample_rate: int, method: str = "auto") -> None:
        self._chunks = chunks
        self._stretch = time_scaler(speed, sample_rate, method)

    def __iter__(self):
        for chunk in self._chunks:
            out = self._stretch.push(chunk)
            if out.size:
                yield out
        yield self._stretch.finish()

    def cancel(self) -> None:
        self._chunks.cancel()
