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

from cadenza.engine.request import SynthesisRequest
from cadenza.engine.stream_handle import StreamHandle
from cadenza.errors import RequestCancelledError
from cadenza.server.errors import busy_error


class Admission:
    """At most ``limit`` synthesis requests in flight; beyond that, 429 at once (no waiting room to fill up)."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        self.limit, self.retry_after_s = limit, retry_after_s
        self._lock = threading.Lock()
        self.inflight = 0

    def acquire(self) -> Slot:
        with self._lock:
            if self.inflight >= self.limit:
                raise busy_error(f"the server is busy: {self.inflight} requests in flight (limit {self.limit}); "
                                 "retry in a moment", self.retry_after_s)
            self.inflight += 1
        return Slot(self)

    def _release(self) -> None:
        with self._lock:
            self.inflight -= 1


class Slot:
    def __init__(self, admission: Admission) -> None:
        self._admission, self._held = admission, True

    def release(self) -> None:  # idempotent: every exit path may call it
        if self._held:
            self._held = False
            self._admission._release()


class EngineStream:
    """Chunks of one utterance made of several engine requests, spoken in order (long inputs, see segments.py).

    ``requests`` are submitted lazily, one after the other. ``stream=False`` uses the engine's whole-utterance
    path (needed for ``speed != 1``). ``handle`` instead of ``requests``: a bi-streaming request already submitted.
    """

    def __init__(self, submit: Callable[[SynthesisRequest, bool], StreamHandle], requests: list[SynthesisRequest],
                 stream: bool = True, limiter: anyio.CapacityLimiter | None = None,
                 handle: StreamHandle | None = None) -> None:
        self._submit, self._pending, self._stream = submit, list(requests), stream
        self._limiter = limiter
        self._lock = threading.Lock()
        self._handle: StreamHandle | None = handle
        self._iter: Iterator[np.ndarray] | None = iter(handle) if handle is not None else None
        self.cancelled = False
        self.started = time.perf_counter()
        self.samples = 0

    def next_blocking(self) -> np.ndarray | None:
        """The next chunk, or ``None`` at the end (or after ``cancel``). Raises the engine's errors."""
        while True:
            with self._lock:
                if self.cancelled:
                    return None
                if self._iter is None:
                    if not self._pending:
                        return None
                    self._handle = self._submit(self._pending.pop(0), self._stream)
                    self._iter = iter(self._handle)
                it = self._iter
            try:
                chunk = next(it)
            except StopIteration:
                with self._lock:
                    self._iter = self._handle = None
                continue
            except RequestCancelledError:
                if self.cancelled:
                    return None
                raise
            except BaseException:
                raise
            if chunk.size:
                self.samples += chunk.size
                return chunk

    async def next(self) -> np.ndarray | None:
        return await anyio.to_thread.run_sync(self.next_blocking, limiter=self._limiter, abandon_on_cancel=True)

    async def map(self, fn: Callable[[np.ndarray | None], bytes]):
        """Run ``fn(chunk)`` (e.g. an encoder) in the same worker thread as the read: one hop per chunk."""

        def step():
            return fn(self.next_blocking())

        return await anyio.to_thread.run_sync(step, limiter=self._limiter, abandon_on_cancel=True)

    def cancel(self) -> None:
        """Free the engine request (thread-safe, idempotent). Pending segments are never submitted."""
        with self._lock:
            self.cancelled = True
            self._pending.clear()
            handle = self._handle
        if handle is not None:
            handle.cancel()
