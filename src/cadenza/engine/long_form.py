"""Long text: several segment requests with the same voice, run a few at a time, joined in order.

Segments share one ``SpeakerPrompt`` (same prompt tokens, mel and x-vector), so voice and pace stay consistent.
Up to ``window`` segments are in the scheduler at once: their LM steps are batched together, and when streaming the
next segment is already being generated while the current one plays, so there is no gap at the joins. The Python API
and the server both speak long text through ``SegmentStream``.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from cadenza.engine.request import SynthesisRequest
from cadenza.engine.stream_handle import StreamHandle

Submit = Callable[[SynthesisRequest, bool], StreamHandle]  # (request, stream) -> handle, e.g. Scheduler.submit


class SegmentStream:
    """Audio chunks of ``requests`` in order, with up to ``window`` of them submitted at once.

    Iterate (one consumer thread) for float32 chunks. ``cancel()`` may come from any thread: segments not yet
    submitted never are, and those in flight are cancelled (a reader blocked in one of them wakes up with
    ``RequestCancelledError``; after ``cancel`` iteration ends). ``on_segment(done)`` is called after each segment.

    ``open_ended``: more segments may come (``add``, from any thread) until ``end()``; the reader waits for them.
    Text that arrives sentence by sentence is spoken this way. ``fail(exc)`` ends the stream with ``exc``.
    """

    def __init__(self, submit: Submit, requests: Sequence[SynthesisRequest], window: int = 2, stream: bool = True,
                 on_segment: Callable[[int], None] | None = None, open_ended: bool = False) -> None:
        self._submit, self._window, self._stream, self._on_segment = submit, max(1, window), stream, on_segment
        self._pending = collections.deque(requests)
        self._running: collections.deque[StreamHandle] = collections.deque()
        self._current: Iterator[np.ndarray] | None = None
        self._cond = threading.Condition()
        self._ended = not open_ended
        self._error: BaseException | None = None
        self.cancelled = False
        self.done = 0

    def __iter__(self) -> SegmentStream:
        return self

    def add(self, requests: Sequence[SynthesisRequest]) -> None:
        """More segments (open-ended streams only, before ``end``)."""
        with self._cond:
            if self._ended:
                raise RuntimeError("segments added after the stream's end")
            self._pending.extend(requests)
            self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self._error, self._ended = exc, True
            self._pending.clear()
            self._cond.notify_all()

    def __next__(self) -> np.ndarray:
        while True:
            with self._cond:
                while True:
                    if self.cancelled:
                        raise StopIteration
                    while self._pending and len(self._running) < self._window:
                        self._running.append(self._submit(self._pending.popleft(), self._stream))
                    if self._running:
                        break
                    if self._error is not None:
                        raise self._error
                    if self._ended:
                        raise StopIteration
                    self._cond.wait()
                if self._current is None:
                    self._current = iter(self._running[0])
                current = self._current
            try:
                return next(current)
            except StopIteration:
                with self._cond:
                    if self._running:
                        self._running.popleft()
                    self._current = None
                    self.done += 1
                    done = self.done
                if self._on_segment is not None:
                    self._on_segment(done)

    def cancel(self) -> None:
        """Free every segment (thread-safe, idempotent)."""
        with self._cond:
            self.cancelled = True
            self._pending.clear()
            running = list(self._running)
            self._cond.notify_all()
        for handle in running:
            handle.cancel()


def synthesize_segments(submit: Submit, requests: Sequence[SynthesisRequest], window: int = 4,
                        on_segment: Callable[[int], None] | None = None) -> np.ndarray:
    """All segments, non-streaming; returns the concatenated float32 audio."""
    segments = SegmentStream(submit, requests, window, stream=False, on_segment=on_segment)
    try:
        return np.concatenate(list(segments) or [np.zeros(0, dtype=np.float32)])
    finally:
        segments.cancel()  # no-op when complete; frees what is in flight after an error


def stream_segments(submit: Submit, requests: Sequence[SynthesisRequest], window: int = 2,
                    on_segment: Callable[[int], None] | None = None) -> Iterator[np.ndarray]:
    """Audio chunks of every segment in order, as soon as each is ready; closing the iterator frees the rest."""
    segments = SegmentStream(submit, requests, window, stream=True, on_segment=on_segment)
    try:
        yield from segments
    finally:
        segments.cancel()
