"""Give the C heap's free memory back to the operating system once every engine in the process has gone idle.

Why: a long stream leaves the process ~200 MB larger after it ends (the built-in model, 45 s of audio: RSS 351 ->
562 MB), and it stays so: glibc keeps freed blocks of its heaps for reuse (its mmap threshold rises as large
buffers are freed, so later ones come from the heap, which it trims only at the top). That is retention, not a
leak (the next request reuses it), but an idle server holding its peak keeps memory from the replicas beside it.
``malloc_trim(0)`` hands the free pages back (562 -> 404 MB) in ~15 ms; done on a thread of its own, after the last
request has ended and a short quiet spell (``DELAY_S``) has passed with no new one, it costs a request nothing.
``benchmarks/idle_memory.py`` measures it.

Engines report through ``busy()`` / ``idle()`` (each call of one engine's ``busy`` paired with one ``idle``); the
trim runs when the process-wide count of busy engines falls to zero and stays there for ``DELAY_S``. Where glibc's
``malloc_trim`` does not exist (macOS, Windows, musl) nothing runs.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

DELAY_S = 0.5  # quiet time after the last request before trimming (a burst of requests pays nothing)


def _glibc_trim() -> Callable[[], object] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class IdleMemoryRelease:
    """Counts busy engines; a thread trims the heap once the count has stayed at zero for ``delay_s``.
    ``trim``: the call that releases memory (glibc's ``malloc_trim(0)``; None: do nothing). ``trims``: how many ran."""

    def __init__(self, trim: Callable[[], object] | None, delay_s: float = DELAY_S) -> None:
        self._trim, self.delay_s = trim, delay_s
        self._cond = threading.Condition()
        self._busy = 0
        self._generation = 0  # changes whenever an engine becomes busy: a pending trim is then called off
        self._pending = False
        self._thread: threading.Thread | None = None
        self.trims = 0

    @property
    def enabled(self) -> bool:
        return self._trim is not None

    def busy(self) -> None:
        with self._cond:
            self._busy += 1
            self._generation += 1
            self._cond.notify_all()

    def idle(self) -> None:
        with self._cond:
            self._busy = max(0, self._busy - 1)
            if self._busy == 0 and self._trim is not None:
                self._pending = True
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="cadenza-idle-memory", daemon=True)
                    self._thread.start()
                self._cond.notify_all()

    def stop(self) -> None:
        """No trim from now on: called at interpreter exit, where a trim racing the runtime's own teardown was the
        suspect of a CLI that sometimes aborted (exit 134) after writing its file."""
        with self._cond:
            self._trim, self._pending = None, False
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                self._pending = False
                start = self._generation
                # the quiet spell: a request that starts meanwhile calls this trim off (the next idle() sets another)
                self._cond.wait_for(lambda start=start: self._generation != start, timeout=self.delay_s)
                if self._generation != start or self._busy or self._trim is None:
                    continue
                trim = self._trim
            try:  # outside the lock: a request starting now only meets glibc's own arena locks
                trim()
                self.trims += 1
            except Exception:  # never let housekeeping take a worker down
                log.exception("releasing free heap memory failed")


# One per process: the heap is the process's, whichever engine freed the memory.
RELEASE = IdleMemoryRelease(_glibc_trim())
atexit.register(RELEASE.stop)
