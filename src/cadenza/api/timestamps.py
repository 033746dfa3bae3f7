"""Word timestamps in the Python API, for every family: ``synthesize(..., timestamps=True)`` fills ``Audio.words``,
``synthesize_stream(..., timestamps=True)`` yields ``TimedChunk`` s (the audio chunk and the words settled by it).

The timings come from the packaged forced aligner (``cadenza.alignment``; accuracy in docs/controls.md, "Word
timestamps") run over the output audio as it is made, so they hold for any model, speed and mode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from cadenza.alignment.aligner import WordTiming
from cadenza.alignment.timer import WordTimer, align_words
from cadenza.errors import InputError


@dataclass
class TimedChunk:
    """One streamed chunk: float32 ``audio`` and the ``words`` whose timings it settled (seconds from the start)."""

    audio: np.ndarray
    words: list[WordTiming] = field(default_factory=list)


def check_timestamps(value: object) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"timestamps must be true or false, got {type(value).__name__}")
    return value


def whole_words(text: str, audio: np.ndarray, sample_rate: int) -> list[WordTiming]:
    return align_words(text, audio, sample_rate)


def timed_stream(chunks: Iterator[np.ndarray], text: str | None, sample_rate: int,
                 pieces: Iterable[str] | None = None) -> Iterator[TimedChunk]:
    """``chunks`` with the word timings of ``text`` (or of ``pieces``, the text as it was fed: a list the feeding
    side appends to, read before each chunk). Closing it closes ``chunks``."""
    timer = WordTimer(text, sample_rate)
    seen = 0
    try:
        for chunk in chunks:
            if pieces is not None:
                for piece in list(pieces)[seen:]:
                    timer.feed_text(piece)
                    seen += 1
            yield TimedChunk(chunk, timer.push(chunk))
        if pieces is not None:
            for piece in list(pieces)[seen:]:
                timer.feed_text(piece)
        words = timer.finish()
        if words:
            yield TimedChunk(np.zeros(0, np.float32), words)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def with_words(audio, text: object):
    """``audio`` (an ``Audio``) with ``words`` set to the timings of ``text``."""
    if not isinstance(text, str):
        raise InputError("timestamps need the text (not text_ids): word timings are given for the words of the text")
    audio.words = whole_words(text, audio.samples, audio.sample_rate)
    return audio


def recording(pieces: Iterable[str], into: list[str]) -> Iterator[str]:
    """``pieces`` as they are read, each also appended to ``into`` (the text a bi-stream has taken so far)."""
    for piece in pieces:
        into.append(piece)
        yield piece


def timed_text_stream(synthesize_stream: Callable[..., Iterator[np.ndarray]], text: str | Iterable[str],
                      sample_rate: int, **kwargs) -> Iterator[TimedChunk]:
    """``synthesize_stream(text, **kwargs)`` as ``TimedChunk`` s: each chunk with the words it settled, of the whole
    text, or of the pieces read so far when the text comes in pieces."""
    if isinstance(text, str):
        return timed_stream(synthesize_stream(text, **kwargs), text, sample_rate)
    taken: list[str] = []
    return timed_stream(synthesize_stream(recording(text, taken), **kwargs), None, sample_rate, pieces=taken)
