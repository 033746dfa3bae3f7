"""``WideLane``: a second thread of a scheduler worker, with more intra-op threads, on which the worker runs a piece
of work while it has the cores to itself.

Why a thread and not ``torch.set_num_threads`` around the work: the intra-op count is per thread under OpenMP, but
``set_num_threads`` also sets the process-wide value that every thread not yet started reads at its first parallel
op -- a server's request threads would then start with whatever count a worker last chose, and their prompt
features would come out with different rounding. A lane sets its count once, to the process-wide value the
scheduler found, so nothing else changes. Handing a piece of work over costs a condition-variable round trip
(tens of microseconds) against the tens of milliseconds of an LM step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch

from cadenza.engine.job_board import start_worker_thread

T = TypeVar("T")


class WideLane:
    """Runs ``fn(*args)`` on its own thread with ``threads`` intra-op threads and waits for it; the thread starts at
    the first use and ends with ``close``. One piece of work at a time (its owner waits for each)."""

    def __init__(self, name: str, threads: int) -> None:
        self.name, self.threads = name, threads
        self._cond = threading.Condition()
        self._task: Callable[[], object] | None = None
        self._result: tuple[bool, object] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def run(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)``, computed on the lane; its exception is raised here."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._task, self._result = (lambda: fn(*args)), None
            self._cond.notify_all()
            while self._result is None:
                self._cond.wait()
            ok, value = self._result
            self._result = None
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)

    def _loop(self) -> None:
        start_worker_thread(self.threads)
        with torch.inference_mode():
            while True:
                with self._cond:
                    while self._task is None and not self._closed:
                        self._cond.wait()
                    if self._task is None:
                        return
                    task, self._task = self._task, None
                try:
                    result = (True, task())
                except BaseException as exc:  # noqa: BLE001 - handed to the owner, which raises it
                    result = (False, exc)
                with self._cond:
                    self._result = result
                    self._cond.notify_all()
