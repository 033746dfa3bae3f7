"""``JobBoard``: the state a scheduler's workers and its consumers share, whatever the model family.

A scheduler (``scheduler.py`` for CosyVoice 2) is a few worker threads in stages -- an *intake* stage that admits
queued requests and generates (an LM), and *audio* stages that turn what it generated into audio chunks -- over one
board: the queued and active jobs, one lock with three wake-up lists (consumers, the intake stage, the audio
stages), the bounded per-request chunk buffers and the consumer side (``feed``/``take``/``cancel``, the
``JobChannel`` a ``StreamHandle`` talks to). The family's workers hold the board and their own explicit state; no
worker reads another's private fields.

Requests beyond ``max_active`` wait in a bounded queue; beyond that ``enqueue`` raises ``EngineBusyError``. A job
keeps its slot until every stage has freed its half (``BoardJob.released``). Nothing sleeps or polls.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from cadenza.engine.idle_memory import RELEASE
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.errors import CadenzaError, EngineBusyError, RequestCancelledError

log = logging.getLogger(__name__)

DONE = object()  # the end of a request's audio (in its buffer) or text (in its text inbox)


@dataclass(eq=False)
class BoardJob:
    """What the board keeps of every request; a family's job adds its own state and says when it is ``released``.
    Flags and buffers change under the board's lock."""

    stream: bool
    done: bool = False  # the final item is in ``buffer``; the workers free their halves
    cancelled: bool = False
    chunks_out: int = 0
    text_inbox: collections.deque = field(default_factory=collections.deque)  # text fed after submit / DONE
    buffer: collections.deque = field(default_factory=collections.deque)  # audio chunks / exception / DONE
    seq: int = 0
    submitted: float = field(default_factory=time.perf_counter)
    first_chunk_s: float | None = None

    @property
    def released(self) -> bool:
        """Every stage has freed its state of this job (its slot is free)."""
        raise NotImplementedError

    def release_all(self) -> None:
        """Free whatever state the job still holds (the engine is closing, or it never started)."""
        raise NotImplementedError


class JobBoard:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        lock = threading.RLock()
        self.cond = threading.Condition(lock)  # consumers wait here (their buffers)
        self.intake_wake = threading.Condition(lock)  # the intake stage: new jobs, text, cancels, free slots
        self.audio_wake = threading.Condition(lock)  # the audio stages: new jobs or tokens, room in a buffer
        self.queued: collections.deque[BoardJob] = collections.deque()
        self.active: list[BoardJob] = []  # admitted and not yet released by every stage
        self.closed = False
        self.chunks_emitted = 0  # audio chunks handed to consumers so far, all requests (a work counter for tests)
        self.threads: list[threading.Thread] = []
        self._seq = itertools.count()
        self._busy = False  # reported to the idle-memory release (``engine/idle_memory.py``)

    # -- consumer side (any thread) ------------------------------------------------------------------------------
    def enqueue(self, job: BoardJob, start_workers: Callable[[], None]) -> None:
        """Queue ``job`` (``start_workers`` is called under the lock when it is the first); frees the job and raises
        when the engine is closed or its queue is full."""
        with self.cond:
            if self.closed or (len(self.queued) >= self.config.max_queued
                               and len(self.active) >= self.config.max_active):
                job.release_all()
                if self.closed:
                    raise CadenzaError("the engine is closed")
                raise EngineBusyError(f"busy: {len(self.active)} requests running and {len(self.queued)} queued")
            job.seq = next(self._seq)
            self.queued.append(job)
            if not self._busy and self.config.release_idle_memory:
                self._busy = True
                RELEASE.busy()
            start_workers()
            self.intake_wake.notify()

    def feed(self, job: BoardJob, item) -> None:
        with self.cond:
            job.text_inbox.append(item)
            self.intake_wake.notify()

    def take(self, job: BoardJob):
        with self.cond:
            while not job.buffer:
                if self.closed and not self.workers_alive():
                    return RequestCancelledError("the engine was closed")
                self.cond.wait()
            item = job.buffer.popleft()
            self.audio_wake.notify_all()  # room in the buffer: its audio stage may resume this request
            return item

    def cancel(self, job: BoardJob) -> None:
        with self.cond:
            if not job.done:
                job.cancelled = True
                self.intake_wake.notify()  # the intake stage ends it

    @property
    def load(self) -> tuple[int, int]:
        """(active, queued) request counts; a request is active until its state is freed."""
        with self.cond:
            return len(self.active), len(self.queued)

    # -- workers -------------------------------------------------------------------------------------------------
    def admit_one(self) -> BoardJob:
        """Move the first queued job into a free slot (the caller checked there is one and a job). Caller holds the
        lock."""
        job = self.queued.popleft()
        self.active.append(job)
        self.audio_wake.notify_all()  # the audio stages see the new job
        return job

    def finish(self, job: BoardJob, item) -> None:
        """Deliver the final item (``DONE`` or an exception); the workers free the job's state. Caller holds the
        lock."""
        if not job.done:
            job.done = True
            job.buffer.append(item)
        self.wake_all()  # its consumer; every stage frees its half

    def end(self, jobs: list[BoardJob], item) -> None:
        """``finish`` each job with ``item``, taking the lock."""
        with self.cond:
            for job in jobs:
                self.finish(job, item)

    def emit(self, job: BoardJob, audio: np.ndarray) -> None:
        """Hand a chunk to the job's consumer (dropped when the job ended meanwhile)."""
        with self.cond:
            if job.done:  # ended meanwhile (cancelled, or failed in another stage)
                return
            if job.first_chunk_s is None:
                job.first_chunk_s = time.perf_counter() - job.submitted
            job.chunks_out += 1
            self.chunks_emitted += 1
            job.buffer.append(audio)
            self.cond.notify_all()
            if job.chunks_out == 1:
                self.intake_wake.notify()  # first audio: requests paused for it may go on

    def room(self, job: BoardJob) -> bool:
        """Whether the job's consumer has room for another chunk. Caller holds the lock."""
        return len(job.buffer) < self.config.max_buffered_chunks

    def prune(self) -> None:
        """Drop released jobs: their slot is free at once. Caller holds the lock."""
        if any(j.released for j in self.active):
            self.active = [j for j in self.active if not j.released]
            self.intake_wake.notify()  # free slots: queued requests may start
        self._note_idle()

    def _note_idle(self) -> None:
        """Tell the idle-memory release that this engine holds no request any more. Caller holds the lock."""
        if self._busy and not self.active and not self.queued:
            self._busy = False
            RELEASE.idle()

    def wake_all(self) -> None:
        """Caller holds the lock."""
        self.cond.notify_all()
        self.intake_wake.notify()
        self.audio_wake.notify_all()

    def fail_all(self, exc: BaseException) -> None:
        """A worker itself failed (a bug): close, and end every request with ``exc`` instead of hanging."""
        with self.cond:
            self.closed = True
            for job in self.active + list(self.queued):
                self.finish(job, exc)
            self.wake_all()

    # -- threads -------------------------------------------------------------------------------------------------
    def start(self, loops: list[tuple[str, Callable[[], None], int]]) -> None:
        """Start one thread per ``(name, loop, intra-op threads)``; returns once all run. Caller holds the lock."""
        cores = torch.get_num_threads()
        started = threading.Barrier(len(loops) + 1)
        self.threads = [threading.Thread(target=self._worker, args=(loop, threads, started), name=name, daemon=True)
                        for name, loop, threads in loops]
        for thread in self.threads:
            thread.start()
        meet(started)
        torch.set_num_threads(cores)  # a worker's count leaks into the process-wide default: give it back
        # At exit, let the workers end their step: a daemon thread still inside torch when the interpreter finalises
        # is killed there and aborts the process ("terminate called without an active exception", exit 134), e.g.
        # a script that leaves a stream early and exits without closing the model.
        me = weakref.ref(self)
        atexit.register(lambda: (board := me()) is not None and board.close())

    def _worker(self, loop: Callable[[], None], threads: int, started: threading.Barrier) -> None:
        start_worker_thread(threads)
        meet(started)
        try:
            with torch.inference_mode():
                loop()
        except Exception as exc:  # a bug in the worker itself: fail every request loudly instead of hanging
            log.exception("scheduler worker failed; closing the engine")
            self.fail_all(exc)

    def workers_alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def close(self) -> None:
        """Stop the workers (they end every request) and wait for them."""
        with self.cond:
            self.closed = True
            self.wake_all()
        for thread in self.threads:
            thread.join(timeout=30)
        with self.cond:
            if self._busy:  # a closed engine holds nothing that counts
                self._busy = False
                RELEASE.idle()


def start_worker_thread(threads: int) -> None:
    """Set up the calling worker thread: no autograd, ``threads`` intra-op threads of its own."""
    torch.set_grad_enabled(False)
    # Under OpenMP the count is per thread, but a thread's first parallel op re-applies the process-wide value
    # (last set by any thread): run one first, then set this thread's count for good.
    torch.set_num_threads(threads)
    torch.zeros(1 << 16).add_(1)
    torch.set_num_threads(threads)


def meet(barrier: threading.Barrier) -> None:
    """Meet at ``barrier``; a party that never comes (nothing blocks before it) only costs the timeout."""
    try:
        barrier.wait(timeout=30)
    except threading.BrokenBarrierError:
        pass
