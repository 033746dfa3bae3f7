"""The VoxCPM 2 request scheduler: all active requests advance together, one patch step at a time (continuous
batching; docs/performance.md, "VoxCPM 2 batching").

The consumer interface is the CosyVoice 2 scheduler's (``engine/scheduler.py``): ``submit(request, stream)`` returns a
``StreamHandle`` yielding float32 chunks at 48 kHz — one per patch, or with ``stream=False`` the whole utterance as
one chunk (``VoxCPM2Engine.synthesize``'s waveform) — ``load`` is ``(active, queued)``, ``config`` the
``SchedulerConfig`` (``max_active``, ``max_queued``, ``max_buffered_chunks``, the worker fields below; the others are
CosyVoice 2's), ``close()`` stops it. Past ``max_active`` running and ``max_queued`` waiting, ``submit`` raises
``EngineBusyError``. A cancelled request (``handle.cancel()`` or a dropped iterator) ends at once and its caches are
freed before its next step; a failing request fails alone (its consumer gets the exception). Each request has a
bounded chunk buffer (``max_buffered_chunks``): a full one is not stepped until its consumer reads, so a slow reader
holds up no one else.

**Workers.** ``n`` threads (``SchedulerConfig.vocoder_workers``, default two when the process may use two CPU cores:
VoxCPM 2 has no vocoder stage, each worker generates and decodes). A worker takes an even share of the requests with
work (``ceil(all / n)``, oldest first, counting those the others hold) and runs one step for them:

1. per request (``batched.RequestSteps``): start an attempt where needed (``retry.RetryRun``, prefill, a stream's
   decoder warmed on the prompt tail) and draw the patch's noise from the request's own generator;
2. batched: ``batched.step_runs`` (DiT condition, flow sampler per ``(timesteps, CFG-Zero*)`` group with per-row cfg,
   stop head); each request's retry state machine takes its patch; ``batched.advance_runs`` (LocEnc, both LMs);
3. batched: AudioVAE streaming decode of released patches (``batched.decode_pending``, one patch per stream per
   call); a non-streaming request decodes its whole utterance when done.

Two single-threaded workers beat one with two intra-op threads on two cores (docs/performance.md), but a lone request
gains from the second core: while one request is active and no other process uses the cores (``MachineLoad``: a
split op waits at its end for a thread the OS has not scheduled) its worker uses all of torch's threads (as set where
the engine was built), otherwise each ``torch threads / n`` (``SchedulerConfig.vocoder_threads`` fixes it). A request's
state is touched only by the worker holding it. Workers run while there are requests (an idle engine holds no
thread). ``exclusive()`` holds the steps back (LoRA changes). Nothing sleeps or polls: one lock, two conditions.

**Numerics.** A request draws the same noise and takes the same decisions as alone; its numbers differ from its run
alone by float rounding only (~1e-7 relative: CPU GEMM kernels sum in another order for another row or thread count).
Up to ``n`` requests never share a step (one per worker): at a fixed thread count they equal their runs alone exactly.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from cadenza.engine.idle_memory import RELEASE
from cadenza.engine.job_board import DONE, meet, start_worker_thread
from cadenza.engine.machine_load import MachineLoad
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.engine.stream_handle import StreamHandle
from cadenza.errors import (
    CadenzaError,
    EngineBusyError,
    InputError,
    LoRAInUseError,
    RequestCancelledError,
    UnknownLoRAError,
)
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.batched import RequestSteps, advance_runs, decode_pending, step_runs
from cadenza.models.voxcpm2.lora_bank import BankedLoRA
from cadenza.models.voxcpm2.model import VoxCPM2Model
from cadenza.models.voxcpm2.request import VoxCPM2Request
from cadenza.models.voxcpm2.retry import RetryOutcome

log = logging.getLogger(__name__)


@dataclass(eq=False)
class VoxCPM2Job:
    """One request inside the scheduler. ``steps`` (caches, decoder, retry state) belongs to the worker holding the job
    (``claimed``); flags and ``buffer`` change under the scheduler lock."""

    request: VoxCPM2Request
    steps: RequestSteps
    done: bool = False  # the final item (DONE or an exception) is in ``buffer``
    cancelled: bool = False
    claimed: bool = False  # a worker is stepping it
    released: bool = False  # its state is freed and its slot given back
    buffer: collections.deque = field(default_factory=collections.deque)  # audio chunks, then DONE / an exception
    chunks_out: int = 0
    submitted: float = field(default_factory=time.perf_counter)
    first_chunk_s: float | None = None

    @property
    def stream(self) -> bool:
        return self.steps.stream


def _machine_cores() -> int:
    """CPU cores this process may run on (the workers run side by side; intra-op threads are torch's setting)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _publish(source: RetryOutcome, target: RetryOutcome) -> None:
    """Copy a finished request's outcome into the object its caller holds."""
    target.attempts[:] = source.attempts
    target.seed, target.truncated, target.result = source.seed, source.truncated, source.result


class VoxCPM2Scheduler:
    def __init__(self, model: VoxCPM2Model, vae: AudioVAE, config: SchedulerConfig | None = None) -> None:
        self.model, self.vae = model, vae
        self.config = config or SchedulerConfig()
        lock = threading.RLock()  # re-entrant: a dropped handle may be cancelled by the GC inside a locked block
        self._cond = threading.Condition(lock)  # consumers wait here (their buffers)
        self._work = threading.Condition(lock)  # workers and exclusive() wait here
        self._queued: collections.deque[VoxCPM2Job] = collections.deque()
        self._active: list[VoxCPM2Job] = []
        self._closed = False
        self._busy = False  # reported to the idle-memory release (``engine/idle_memory.py``)
        self._paused = 0  # exclusive() sections waiting or running: no new steps
        self._stepping = 0  # workers inside a step
        self._threads: list[threading.Thread] = []  # the running workers
        # Intra-op threads as set where the engine is built (a fresh thread's count can be a worker's leftover).
        self._cores = torch.get_num_threads()
        self._workers, self._worker_threads = 1, 1
        self.machine = MachineLoad()  # a lone request takes every core only while other processes leave them free
        me = weakref.ref(self)  # at exit, let the workers end their step: killing one inside torch aborts the process
        atexit.register(lambda: (scheduler := me()) is not None and scheduler.close())
        self.steps = 0  # steps run so far, all workers (for tests and benchmarks)
        self.max_batch = 0  # most requests generated in one batched step so far

    # -- consumer side (any thread) ------------------------------------------------------------------------------
    def submit(self, request: VoxCPM2Request, stream: bool = True) -> StreamHandle:
        """Queue a request. ``request.outcome`` is reset now and filled in when its consumer reaches the end of the
        audio (generation runs ahead of the reader, so the outcome tells what the reader got, as with
        ``stream_with_retry``); it stays empty for a cancelled or failed request."""
        request.outcome = RetryOutcome()
        job = VoxCPM2Job(request, RequestSteps(self.model, self.vae, request, stream))
        with self._cond:
            if self._closed:
                raise CadenzaError("the engine is closed")
            if request.lora is not None and not request.lora.registered:
                raise UnknownLoRAError(f"the LoRA adapter {request.lora.name!r} was removed after this request was "
                                       "built")
            self._admit()
            if not self._queued and len(self._active) < self.config.max_active:
                self._active.append(job)
            elif len(self._queued) < self.config.max_queued:
                self._queued.append(job)
            else:
                raise EngineBusyError(f"busy: {len(self._active)} requests running and {len(self._queued)} queued")
            if not self._busy and self.config.release_idle_memory:
                self._busy = True
                RELEASE.busy()
            self._ensure_workers()
            self._work.notify_all()
        return StreamHandle(self, job)

    @property
    def load(self) -> tuple[int, int]:
        """(active, queued) request counts; a request is active until its state is freed."""
        with self._cond:
            return len(self._active), len(self._queued)

    def feed(self, job: VoxCPM2Job, item: object) -> None:
        """VoxCPM 2 reads whole texts: a handle can only fail its request (``handle.fail(exc)``)."""
        if not isinstance(item, BaseException):
            raise InputError("VoxCPM 2 requests take their whole text when they are built: there is no text to feed")
        with self._cond:
            self._finish(job, item)

    def take(self, job: VoxCPM2Job) -> object:
        with self._cond:
            while not job.buffer:
                if self._closed and not any(t.is_alive() for t in self._threads):
                    return RequestCancelledError("the engine was closed")
                self._cond.wait()
            item = job.buffer.popleft()
            if item is DONE:
                _publish(job.steps.retry.outcome, job.request.outcome)
            elif job.stream and not job.done:
                self._work.notify_all()  # room in its buffer: it may be stepped again
            return item

    def cancel(self, job: VoxCPM2Job) -> None:
        with self._cond:
            if not job.done:
                job.cancelled = True
                self._finish(job, RequestCancelledError("cancelled"))

    def wait_freed(self, handle: StreamHandle, timeout: float = 60.0) -> None:
        """Wait until the ended request of ``handle`` has its state freed (at most the end of the step it is in),
        and free it now if no worker holds it. Returns at once in a worker thread."""
        job = handle._job
        if threading.current_thread() in self._threads:
            return
        with self._cond:
            deadline = time.monotonic() + timeout
            while job.claimed and not job.released and (left := deadline - time.monotonic()) > 0:
                self._work.wait(left)
            if job.done and not job.claimed:
                self._release(job)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No step runs inside (e.g. to change LoRA adapters): waits for running steps, holds back new ones."""
        with self._cond:
            self._paused += 1
            while self._stepping:
                self._work.wait()
        try:
            yield
        finally:
            with self._cond:
                self._paused -= 1
                self._work.notify_all()

    def retire_lora(self, adapter: BankedLoRA) -> None:
        """Mark ``adapter`` removed (``submit`` refuses its requests from now on) unless a queued or running request
        uses it: then ``LoRAInUseError``."""
        with self._cond:
            users = sum(j.request.lora is adapter and not j.done for j in [*self._active, *self._queued])
            if users:
                raise LoRAInUseError(f"the LoRA adapter {adapter.name!r} is in use by {users} request(s): remove it "
                                     "when they have ended")
            adapter.registered = False

    def close(self) -> None:
        """End every request (``RequestCancelledError``), stop the workers and free all state."""
        with self._cond:
            self._closed = True
            for job in [*self._active, *self._queued]:
                self._finish(job, RequestCancelledError("the engine was closed"))
            self._queued.clear()
            self._work.notify_all()
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=60)
        with self._cond:
            for job in [j for j in self._active if not j.claimed]:
                self._release(job)
            self._note_idle()

    def _note_idle(self) -> None:
        """Tell the idle-memory release that this engine holds no request any more. Caller holds the lock."""
        if self._busy and not self._active and not self._queued:
            self._busy = False
            RELEASE.idle()

    # -- bookkeeping (caller holds the lock) ---------------------------------------------------------------------
    def _admit(self) -> None:
        while self._queued and len(self._active) < self.config.max_active:
            self._active.append(self._queued.popleft())

    def _finish(self, job: VoxCPM2Job, item: object) -> None:
        """Deliver the final item (DONE or an exception); a worker frees the job's state (a queued job has none)."""
        if not job.done:
            job.done = True
            job.buffer.append(item)
            if job in self._queued:
                self._queued.remove(job)
                job.released = True
            self._cond.notify_all()
            self._work.notify_all()

    def _emit(self, job: VoxCPM2Job, audio: np.ndarray) -> None:
        if job.done:  # cancelled meanwhile
            return
        if job.first_chunk_s is None:
            job.first_chunk_s = time.perf_counter() - job.submitted
        job.chunks_out += 1
        job.buffer.append(audio)
        self._cond.notify_all()

    def _reap(self) -> None:
        for job in [j for j in self._active if j.done and not j.claimed]:
            self._release(job)

    def _release(self, job: VoxCPM2Job) -> None:
        """Free an ended job's state (no worker holds it); its slot goes to a queued request."""
        if job.released:
            return
        job.steps.close()
        job.released = True
        if job in self._active:
            self._active.remove(job)
            self._admit()
            self._work.notify_all()

    def _room(self, job: VoxCPM2Job) -> int:
        """Chunks a streaming job may still put in its buffer."""
        return self.config.max_buffered_chunks - len(job.buffer)

    def _has_work(self, job: VoxCPM2Job) -> bool:
        if job.done or job.claimed:
            return False
        if not job.stream:
            return True  # generating, or its utterance to decode
        if job.steps.pending:
            return self._room(job) > 0
        return not job.steps.generating or self._room(job) > 0  # generation ended: deliver DONE

    # -- workers -------------------------------------------------------------------------------------------------
    def _ensure_workers(self) -> None:
        """Start the missing workers (they run while there are requests, so an idle engine holds no thread)."""
        if self._threads and len(self._threads) >= self._workers:
            return
        if not self._threads:
            self._workers = self.config.vocoder_workers or (2 if _machine_cores() >= 2 else 1)
            self._worker_threads = self.config.vocoder_threads or max(1, self._cores // self._workers)
        caller = torch.get_num_threads()
        missing = self._workers - len(self._threads)
        started = threading.Barrier(missing + 1)
        new = [threading.Thread(target=self._worker, args=(started,), name="cadenza-vx2", daemon=True)
               for _ in range(missing)]
        self._threads += new
        for thread in new:
            thread.start()
        meet(started)
        torch.set_num_threads(caller)  # a worker's count leaks into the process-wide default: give it back

    def _worker(self, started: threading.Barrier) -> None:
        threads = self._worker_threads
        start_worker_thread(threads)
        meet(started)
        try:
            with torch.inference_mode():
                self._loop(threads)
        except Exception as exc:  # a bug in the worker itself: fail every request loudly instead of hanging
            log.exception("VoxCPM 2 scheduler worker failed; closing the engine")
            with self._cond:
                self._closed = True
                self._threads.remove(threading.current_thread())
                for job in [*self._active, *self._queued]:
                    self._finish(job, exc)
                self._work.notify_all()

    def _loop(self, threads: int) -> None:
        while True:
            with self._cond:
                while True:
                    self._reap()
                    if self._closed or not (self._active or self._queued):  # restarted by the next submit
                        self._threads.remove(threading.current_thread())
                        self._note_idle()
                        self._work.notify_all()
                        return
                    ready = [] if self._paused else [j for j in self._active if self._has_work(j)]
                    if ready:
                        break
                    self._work.wait()
                # An even share of all the work, counting what the other workers hold (they hold it until their
                # step ends): 8 requests on two workers run as two batches of 4, whoever claims first.
                held = sum(j.claimed for j in self._active)
                batch = ready[:-(-(len(ready) + held) // self._workers)]
                for job in batch:
                    job.claimed = True
                self._stepping += 1
                alone = len(self._active) == 1
            want = (self._cores if alone and self.config.vocoder_threads is None and self.machine.idle()
                    else self._worker_threads)
            if want != threads:  # a lone worker takes every core; two share them
                threads = want
                torch.set_num_threads(threads)
            try:
                self._step(batch)
            finally:
                with self._cond:
                    for job in batch:
                        job.claimed = False
                    self._stepping -= 1
                    self.steps += 1
                    self._work.notify_all()

    def _fail(self, jobs: list[VoxCPM2Job], exc: BaseException) -> None:
        with self._cond:
            for job in jobs:
                self._finish(job, exc)

    def _step(self, batch: list[VoxCPM2Job]) -> None:
        """One patch for every job of ``batch`` that may generate, then the decoding it made possible."""
        with self._cond:
            may_generate = [j for j in batch if j.steps.generating and not j.done
                            and (not j.stream or len(j.steps.pending) < self._room(j))]
        jobs, noise = [], []
        for job in may_generate:
            try:
                noise.append(job.steps.next_noise())  # its own generator, in patch order: batching never changes it
                jobs.append(job)
            except Exception as exc:
                self._fail([job], exc)
        if jobs:
            self._generate(jobs, noise)
        self._decode(batch)

    def _generate(self, jobs: list[VoxCPM2Job], noise: list[torch.Tensor]) -> None:
        try:
            steps = step_runs(self.model, [j.steps.run for j in jobs], noise)
        except Exception as exc:
            log.exception("VoxCPM 2 batched step failed")
            self._fail(jobs, exc)
            return
        self.max_batch = max(self.max_batch, len(jobs))
        go_on = []
        for job, step in zip(jobs, steps):
            try:
                if job.steps.take(step) and not job.done:  # (a cancelled job need not advance)
                    go_on.append((job, step.patch))
            except Exception as exc:
                self._fail([job], exc)
        try:
            advance_runs(self.model, [j.steps.run for j, _ in go_on], [p for _, p in go_on])
        except Exception as exc:
            log.exception("VoxCPM 2 batched LM step failed")
            self._fail([j for j, _ in go_on], exc)

    def _decode(self, batch: list[VoxCPM2Job]) -> None:
        for job in batch:
            if not job.stream and not job.steps.generating and not job.done:
                try:
                    wav = job.steps.whole()
                except Exception as exc:
                    self._fail([job], exc)
                    continue
                with self._cond:
                    self._emit(job, wav)
                    self._finish(job, DONE)
        while True:  # rounds of one patch per stream, as far as their buffers have room
            with self._cond:
                rows = []
                for job in batch:
                    if not job.stream or job.done:
                        continue
                    if job.steps.pending and self._room(job) > 0:
                        rows.append(job)
                    elif not job.steps.pending and not job.steps.generating:
                        self._finish(job, DONE)
            if not rows:
                return
            try:
                chunks = decode_pending([j.steps for j in rows])
            except Exception as exc:
                log.exception("VoxCPM 2 batched decoding failed")
                self._fail(rows, exc)
                continue
            with self._cond:
                for job, chunk in zip(rows, chunks):
                    self._emit(job, chunk)
