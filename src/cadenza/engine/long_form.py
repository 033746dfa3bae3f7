"""Long text: several segment requests with the same voice, run a few at a time, joined in order.

Segments share one ``SpeakerPrompt`` (same prompt tokens, mel and x-vector), so voice and pace stay consistent.
Up to ``window`` segments are in the scheduler at once: their LM steps are batched together, and when streaming the
next segment is already being generated while the current one plays, so there is no gap at the joins. Streamed, a
segment beyond the one playing is submitted only once that one has sent its first chunk: submitted together, the
second sentence's first chunk competed with the first's for the LM and the vocoder workers (cadenza-tiny, a
two-sentence reply on a 2-core AVX2 CPU: first chunk 0.77 s against 0.48 s for its first sentence alone, one
thread; docs/performance.md). The Python API and the server both speak long text through ``SegmentStream``.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from cadenza.engine.request import SynthesisRequest
from cadenza.engine.stream_handle import StreamHandle

Submit = Callable[[SynthesisRequest, bool], StreamHandle]  # (request, stream) -> handle, e.g. Scheduler.submit
# A segment that can make at most this many speech tokens (2 s at 25 Hz: "Yes.", "Hi!") holds no later one back: its
# audio may end before the next segment's first chunk could come (the benchmark's short openers stalled 0.04-0.19 s).
SHORT_SEGMENT_TOKENS = 50


class SegmentStream:
    """Audio chunks of ``requests`` in order, with up to ``window`` of them submitted at once.

    Iterate (one consumer thread) for float32 chunks. ``cancel()`` may come from any thread: segments not yet
    submitted never are, and those in flight are cancelled (a reader blocked in one of them wakes up with
    ``RequestCancelledError``; after ``cancel`` iteration ends). ``on_segment(done)`` is called after each segment.

    ``open_ended``: more segments may come (``add``, from any thread) until ``end()``; the reader waits for them.
    ``stagger`` (streamed only): submit a segment beyond the playing one once that one has sent a chunk (the default;
    False fills the window at once, as non-streamed synthesis does).
    Text that arrives sentence by sentence is spoken this way. ``fail(exc)`` ends the stream with ``exc``.
    """

    def __init__(self, submit: Submit, requests: Sequence[SynthesisRequest], window: int = 2, stream: bool = True,
                 on_segment: Callable[[int], None] | None = None, open_ended: bool = False,
                 stagger: bool = True) -> None:
        self._submit, self._window, self._stream, self._on_segment = submit, max(1, window), stream, on_segment
        self._stagger = stream and stagger  # streamed: a segment beyond the playing one waits for its first chunk
        self._pending = collections.deque(requests)
        # Segments in flight: (handle, short), short = it can make at most 2 s of speech (``SHORT_SEGMENT_TOKENS``).
        self._running: collections.deque[tuple[StreamHandle, bool]] = collections.deque()
        self._current: Iterator[np.ndarray] | None = None
        self._head_sent = False  # the segment playing (streamed) has sent a chunk: the next may start
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

    @property
    def pending(self) -> int:
        """Segments added and not yet submitted."""
        with self._cond:
            return len(self._pending)

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
                    self._fill()
                    if self._running:
                        break
                    if self._error is not None:
                        raise self._error
                    if self._ended:
                        raise StopIteration
                    self._cond.wait()
                if self._current is None:
                    self._current = iter(self._running[0][0])
                current = self._current
            try:
                chunk = next(current)
            except StopIteration:
                with self._cond:
                    if self._running:
                        self._running.popleft()
                    self._current, self._head_sent = None, False
                    self.done += 1
                    done = self.done
                if self._on_segment is not None:
                    self._on_segment(done)
                continue
            if not self._head_sent:
                with self._cond:  # the next segment starts now, not when the reader asks for more
                    self._head_sent = True
                    if not self.cancelled:
                        try:
                            self._fill()
                        except Exception:  # noqa: BLE001 - e.g. the engine is busy: raised again by the next call,
                            pass  # after this chunk has reached the reader
            return chunk

    def _fill(self) -> None:
        """Submit pending segments up to the window (streamed: beyond the playing one only once it has sent audio);
        the caller holds ``_cond``."""
        while (self._pending and len(self._running) < self._window
               and (not self._stagger or not self._running or self._head_sent or self._running[0][1])):
            request = self._pending[0]
            handle = self._submit(request, self._stream)  # a refused one stays pending
            self._pending.popleft()
            self._running.append((handle, 0 < getattr(request, "max_tokens", 0) <= SHORT_SEGMENT_TOKENS))

    def cancel(self) -> None:
        """Free every segment (thread-safe, idempotent)."""
        with self._cond:
            self.cancelled = True
            self._pending.clear()
            running = [handle for handle, _ in self._running]
            self._cond.notify_all()
        for handle in running:
            handle.cancel()


def iterate_segments(submit: Submit, requests: Sequence[SynthesisRequest], window: int = 4,
                     on_segment: Callable[[int], None] | None = None) -> Iterator[np.ndarray]:
    """Each segment's whole audio in order, non-streaming, as soon as it and those before it are done: memory for
    the segments in flight only; closing the iterator frees the rest."""
    segments = SegmentStream(submit, requests, window, stream=False, on_segment=on_segment)
    try:
        yield from segments
    finally:
        segments.cancel()  # no-op when complete; frees what is in flight after an error or a close


def stream_segments(submit: Submit, requests: Sequence[SynthesisRequest], window: int = 2,
                    on_segment: Callable[[int], None] | None = None, stagger: bool = True) -> Iterator[np.ndarray]:
    """Audio chunks of every segment in order, as soon as each is ready; closing the iterator frees the rest."""
    segments = SegmentStream(submit, requests, window, stream=True, on_segment=on_segment, stagger=stagger)
    try:
        yield from segments
    finally:
        segments.cancel()


def stream_planned(submit: Submit, first: Sequence[SynthesisRequest], later: Iterator[Sequence[SynthesisRequest]],
                   window: int = 2, low_water: int = 3) -> Iterator[np.ndarray]:
    """``stream_segments`` of a text planned as it is spoken: ``first`` (the first block's segments) at once, each
    batch of ``later`` asked for, in the reader's thread between two chunks, once fewer than ``low_water`` segments
    wait to be submitted. A book's first audio then waits for its first block only, and its planning never competes
    with the engine for the interpreter (``text/blocks.py``). An error planning a later block is raised to the reader
    where that block's audio would have begun; closing the iterator frees what is in flight and plans no more."""
    segments = SegmentStream(submit, first, window, stream=True, open_ended=True)
    more, error = True, None
    try:
        while True:
            while more and segments.pending < low_water:
                try:
                    batch = next(later, None)
                except Exception as exc:  # raised once the segments planned before it have been spoken
                    batch, error = None, exc
                if batch is None:
                    segments.end()
                    more = False
                elif batch:
                    segments.add(batch)
            try:
                chunk = next(segments)
            except StopIteration:
                if error is not None:
                    raise error from None
                return
            yield chunk
    finally:
        segments.cancel()
