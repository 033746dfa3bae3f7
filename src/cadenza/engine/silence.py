"""Exact silence between the segments of one output (SSML ``<break>``): ``Silence`` items among engine requests.

A ``Silence(samples)`` goes through the same long-form path as the requests around it (``SegmentStream``,
``EngineStream``): ``with_silences(submit)`` answers it with one chunk of exactly ``samples`` zeros, in order, and
passes every other item to the engine. Streamed and whole outputs are then the same samples.

The provenance watermark (``cadenza.provenance``) adds its mark to every chunk, and its gains follow the audio one
20 ms block late, so the start of a silence right after speech would carry a faint mark. ``SilenceKeepingEmbedder``
keeps a chunk that is exactly zero exactly zero (the mark's timeline still advances over it, so the audio after the
silence is marked as it would be otherwise): an asked-for pause stays digital silence, in every output format that
is lossless.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from cadenza.provenance import StreamEmbedder


@dataclass(frozen=True)
class Silence:
    """``samples`` zero samples at this place of the output."""

    samples: int

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 0:
            raise ValueError(f"silence length must be a non-negative number of samples, got {self.samples!r}")


class _SilenceHandle:
    """The ``ChunkStream`` of a ``Silence``: one chunk of zeros (none for zero samples)."""

    def __init__(self, samples: int) -> None:
        self._samples = samples
        self._done = samples == 0

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        if self._done:
            raise StopIteration
        self._done = True
        return np.zeros(self._samples, dtype=np.float32)

    def cancel(self) -> None:
        self._done = True


def with_silences(submit: Callable) -> Callable:
    """``submit(item, stream)`` that answers ``Silence`` items itself and passes requests on to ``submit``."""

    def submit_item(item, stream: bool = True):
        if isinstance(item, Silence):
            return _SilenceHandle(item.samples)
        return submit(item, stream)

    return submit_item


class SilenceKeepingEmbedder:
    """A ``StreamEmbedder`` that leaves chunks of exact zeros as they are (see the module docstring)."""

    def __init__(self, inner: StreamEmbedder) -> None:
        self.inner = inner

    def push(self, chunk: np.ndarray) -> np.ndarray:
        marked = self.inner.push(chunk)  # always: the mark's position moves on over the silence
        return chunk.astype(np.float32, copy=False) if not chunk.any() else marked

    def finish(self) -> np.ndarray:
        return self.inner.finish()


def keep_silence(embedder: StreamEmbedder | None) -> SilenceKeepingEmbedder | None:
    return None if embedder is None else SilenceKeepingEmbedder(embedder)


def marked_chunks(chunks: Iterable[np.ndarray], embedder: StreamEmbedder | None) -> Iterator[np.ndarray]:
    """``chunks`` through ``embedder`` (None: as they are), silences kept; closing this closes ``chunks``."""
    keeper = keep_silence(embedder)
    try:
        for chunk in chunks:
            yield chunk if keeper is None else keeper.push(chunk)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
