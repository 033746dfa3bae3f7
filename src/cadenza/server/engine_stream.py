"""Bridging the engine's blocking chunk iterators to asyncio, with admission control and cancellation.

The scheduler's ``StreamHandle`` blocks its reader until the next chunk is ready, so every read runs in a worker
thread (``anyio.to_thread``) and the event loop never blocks. When the client goes away, the awaiting task is
cancelled at once (``abandon_on_cancel``) and ``cancel()`` marks the engine request cancelled: the scheduler frees
its caches on its next step and wakes the abandoned reader thread with ``RequestCancelledError``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import anyio
import anyio.to_thread
import numpy as np

from cadenza.engine.long_form import SegmentStream
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.stream_handle import StreamHandle
from cadenza.errors import RequestCancelledError
from cadenza.provenance import StreamEmbedder
from cadenza.server.errors import busy_error

# One segment in the engine at a time: each segment's audio is then exactly what a request for it alone gives (same
# seed, same audio), and a long input holds one engine slot, as admission counts it.
SEGMENTS_IN_FLIGHT = 1


class Admission:
    """At most ``limit`` synthesis requests and ``max_work`` estimated audio seconds in flight; beyond either, 429
    at once (no waiting room to fill up).

    Counting work as well as requests keeps one request that asks for ten minutes of audio from weighing the same as
    one that asks for a word. A request is admitted with a small cost first (its text is not planned yet) and
    ``Slot.grow`` adds the rest once it is known.
    """

    def __init__(self, limit: int, retry_after_s: int, max_work: float = float("inf")) -> None:
        self.limit, self.retry_after_s, self.max_work = limit, retry_after_s, max_work
        self._lock = threading.Lock()
        self.inflight = 0
        self.work = 0.0

    def _busy(self, why: str):
        return busy_error(f"the server is busy: {why}; retry in a moment", self.retry_after_s)

    def acquire(self, cost: float = 0.0) -> Slot:
        with self._lock:
            if self.inflight >= self.limit:
                raise self._busy(f"{self.inflight} requests in flight (limit {self.limit})")
            self._take(cost)
            self.inflight += 1
        return Slot(self, cost)

    def _take(self, cost: float) -> None:
        if cost > 0 and self.work + cost > self.max_work:
            raise self._busy(f"{self.work:.0f} s of audio in the making (limit {self.max_work:.0f} s)")
        self.work += cost

    def _release(self, cost: float) -> None:
        with self._lock:
            self.inflight -= 1
            self.work = max(0.0, self.work - cost)


class Slot:
    def __init__(self, admission: Admission, cost: float = 0.0) -> None:
        self._admission, self._held, self.cost = admission, True, cost

    def grow(self, extra: float) -> None:
        """Count ``extra`` more seconds of work; 429 (``APIError``) if that goes over the limit."""
        if extra <= 0 or not self._held:
            return
        with self._admission._lock:
            self._admission._take(extra)
            self.cost += extra

    def release(self) -> None:  # idempotent: every exit path may call it
        if self._held:
            self._held = False
            self._admission._release(self.cost)


class EngineStream:
    """Chunks of one utterance made of several engine requests, spoken in order (long inputs, see segments.py).

    ``requests`` run through the engine's one long-form implementation (``SegmentStream``, one segment in flight). ``stream=False`` uses the engine's whole-utterance path
    (needed for ``speed != 1``). ``handle`` instead of ``requests``: a bi-streaming request already submitted.
    ``max_samples``: the stream ends there (the engine request is cancelled and ``truncated`` set): the server's
    bound on the audio of one request, should the model run on past what its text needed. ``mark``: the model's
    watermark embedder for this output (every chunk goes through it, in order).
    """

    def __init__(self, submit: Callable[[SynthesisRequest, bool], StreamHandle], requests: list[SynthesisRequest],
                 stream: bool = True, limiter: anyio.CapacityLimiter | None = None,
                 handle: StreamHandle | None = None, max_samples: int | None = None,
                 mark: StreamEmbedder | None = None) -> None:
        self._limiter = limiter
        self._mark = mark
        self._handle = handle
        self._source: Iterator[np.ndarray] = (iter(handle) if handle is not None
                                              else SegmentStream(submit, requests, SEGMENTS_IN_FLIGHT, stream))
        self.cancelled = False
        self.started = time.perf_counter()
        self.samples = 0
        self.max_samples = max_samples
        self.truncated = False

    def next_blocking(self) -> np.ndarray | None:
        """The next chunk, or ``None`` at the end (or after ``cancel``). Raises the engine's errors."""
        while True:
            if self.cancelled:
                return None
            try:
                chunk = next(self._source)
            except StopIteration:
                return None
            except RequestCancelledError:
                if self.cancelled:
                    return None
                raise
            if chunk.size:
                if self.max_samples is not None and self.samples + chunk.size > self.max_samples:
                    chunk = chunk[: self.max_samples - self.samples]
                    self.truncated = True
                    self.cancel()
                    if not chunk.size:
                        return None
                self.samples += chunk.size
                return chunk if self._mark is None else self._mark.push(chunk)

    async def next(self) -> np.ndarray | None:
        return await anyio.to_thread.run_sync(self.next_blocking, limiter=self._limiter, abandon_on_cancel=True)

    async def map(self, fn: Callable[[np.ndarray | None], bytes]):
        """Run ``fn(chunk)`` (e.g. an encoder) in the same worker thread as the read: one hop per chunk."""

        def step():
            return fn(self.next_blocking())

        return await anyio.to_thread.run_sync(step, limiter=self._limiter, abandon_on_cancel=True)

    def cancel(self) -> None:
        """Free the engine request(s) (thread-safe, idempotent). Pending segments are never submitted."""
        self.cancelled = True
        if self._handle is not None:
            self._handle.cancel()
        else:
            self._source.cancel()
