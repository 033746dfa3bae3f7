"""The request scheduler: worker threads run the model for every active request, a pipeline of two stages.

* The **LM worker** admits queued requests, feeds bi-streaming text and runs one LM step for every request that has
  LM work: prompts (several new positions) one by one, then all single-token decode steps together in one batched
  forward (per-request KV caches of any length).
* The **vocoder workers** (``SchedulerConfig.vocoder_workers``; two from two cores on; ``engine/vocoder_workers.py``)
  turn speech tokens into audio at the same time. Each owns the requests it was given at admission (the least loaded worker's) and runs the
  flow + HiFT work of the one that has enough tokens for its next chunk — requests still waiting for their first
  chunk go first, then the oldest — together with every ready request of its own whose flow chunk has as many
  frames (their estimator calls run as one batch, ``IncrementalFlow.push_many``, and so do their HiFT calls where
  the mel lengths match, ``vocode_many``). A ready chunk waits up to ``flow_batch_wait_steps`` LM steps for requests
  a few tokens short of a chunk of its size. With no chunk ready, a worker computes the flow of its streams' next
  chunks ahead, as far as the tokens decoded so far fix it (``SchedulerConfig.flow_ahead``), unless a stream waits
  for its first audio.

Running the stages concurrently keeps the cores busy and lets the LM decode while a chunk is vocoded; two
single-threaded vocoder workers use a 2-core CPU better than one with two intra-op threads (docs/performance.md).
Each worker owns its half of a request's state — the LM worker the decoder (KV caches), its vocoder worker the
``StreamSynthesis`` (flow and HiFT caches) — and frees it when the request ends, however it ends; a request keeps
its slot until both halves are freed.

Consumers read chunks from a bounded per-request buffer; a full buffer gets no vocoder work until its consumer reads
(a slow reader holds up no one else). Requests beyond ``max_active`` wait in a bounded queue; beyond that ``submit``
raises ``EngineBusyError``. Nothing sleeps or polls: hand-offs go through one lock and its condition variables.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import threading
import time

import numpy as np
import torch

from cadenza.engine.primed_prompts import PrimedPrompts
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.scheduled_job import DONE, Job
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.engine.stream_handle import StreamHandle
from cadenza.engine.token2wav import StreamSchedule, Token2Wav, TokenChunker
from cadenza.engine.vocoder_workers import VocoderWorkers
from cadenza.errors import CadenzaError, EngineBusyError, RequestCancelledError
from cadenza.models.cosyvoice2.lm_decoding import BistreamDecoder, UnistreamDecoder
from cadenza.models.cosyvoice2.model import CosyVoice2Model
from cadenza.models.cosyvoice2.sampling import RasSampler

log = logging.getLogger(__name__)


def _wait(barrier: threading.Barrier) -> None:
    """Meet at ``barrier``; a party that never comes (nothing blocks before it) only costs the timeout."""
    try:
        barrier.wait(timeout=30)
    except threading.BrokenBarrierError:
        pass


class Scheduler(VocoderWorkers):
    def __init__(self, model: CosyVoice2Model, schedule: StreamSchedule | None = None,
                 config: SchedulerConfig | None = None) -> None:
        self.model = model
        self.schedule = schedule or StreamSchedule()
        self.config = config or SchedulerConfig()
        self.token2wav = Token2Wav(model, self.schedule)
        self._primed = (PrimedPrompts(model.flow, int(self.schedule.primed_prompt_cache_mb * 2**20))
                        if self.schedule.incremental and self.schedule.primed_prompt_cache_mb > 0
                        and model.flow.decoder.estimator.supports_cache else None)
        # One lock, three wake-up lists: consumers wait on ``_cond`` (their buffers), the LM worker and the vocoder
        # workers on their own, so the LM worker's ~100 steps a second wake only the vocoder workers (each then looks
        # at its own requests), not every consumer thread.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._lm_wake = threading.Condition(lock)
        self._vocoder_wake = threading.Condition(lock)
        self._queued: collections.deque[Job] = collections.deque()
        self._active: list[Job] = []  # admitted and not yet released by both workers
        self._seq = itertools.count()
        self._closed = False
        self._lm_steps = 0  # LM steps run so far (the clock of the flow batch wait)
        self.chunks_emitted = 0  # audio chunks handed to consumers so far, all requests (a work counter for tests)
        self._lm_busy = False  # the LM worker has work (a waiting flow chunk may expect partners)
        self._first_audio_pending = False  # see _run_lm
        self._vocoding = 0  # vocoder workers inside a piece of work
        self._threads: list[threading.Thread] = []
        self._vocoder_workers = 1  # the layout, set when the workers start
        self._cores, self._lm_threads, self._vocoder_threads = 1, 1, 1

    # -- consumer side (any thread) ------------------------------------------------------------------------------
    def submit(self, request: SynthesisRequest, stream: bool = True, bistream: bool = False,
               reference_quirks: bool = False) -> StreamHandle:
        """Queue a request. ``bistream``: text arrives later through the handle's ``feed_text``/``end_text``."""
        with torch.no_grad():  # the prompt embeddings (and a primed flow prompt) are built here, in the caller's thread
            decoder = self._decoder(request, bistream, reference_quirks)
            try:
                session = self._primed.session(request.voice) if stream and self._primed is not None else None
            except BaseException:
                if decoder is not None:
                    decoder.close()
                raise
        job = Job(request=request, stream=stream, decoder=decoder, seq=next(self._seq),
                   first_chunk_tokens=self._first_chunk_tokens(request), flow_session=session)
        if decoder is None:
            job.ids, job.lm_done = list(request.source_tokens[0].tolist()), True
        with self._cond:
            if self._closed:
                job.release_lm()
                job.release_vocoder()
                raise CadenzaError("the engine is closed")
            if len(self._queued) >= self.config.max_queued and len(self._active) >= self.config.max_active:
                job.release_lm()
                job.release_vocoder()
                raise EngineBusyError(f"busy: {len(self._active)} requests running and {len(self._queued)} queued")
            self._queued.append(job)
            self._ensure_workers()
            self._lm_wake.notify()
        return StreamHandle(self, job)

    def _decoder(self, request: SynthesisRequest, bistream: bool,
                 reference_quirks: bool) -> UnistreamDecoder | BistreamDecoder | None:
        """The LM decoder of a request (None for voice conversion, which has its speech tokens already)."""
        if request.source_tokens is not None:
            return None
        sampler = RasSampler(self.model.config.lm.sampling, request.generator)
        lm = self.model.lm
        if bistream:
            return BistreamDecoder(lm, request.lm_prompt_text, request.lm_prompt_speech, sampler,
                                   reference_quirks=reference_quirks, capacity=request.max_tokens)
        return UnistreamDecoder(lm, request.text_ids, request.lm_prompt_text, request.lm_prompt_speech,
                                sampler, request.min_tokens, request.max_tokens)

    def _first_chunk_tokens(self, request: SynthesisRequest) -> int:
        """Speech tokens a streaming request needs for its first chunk (first hop + look-ahead)."""
        lookahead = self.model.config.flow.pre_lookahead_len
        chunker = TokenChunker(self.schedule, request.voice.flow_prompt_speech.shape[1], lookahead)
        return chunker.hop + lookahead

    @property
    def load(self) -> tuple[int, int]:
        """(active, queued) request counts; a request is active until its state is freed."""
        with self._cond:
            return len(self._active), len(self._queued)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._wake_all()
        for thread in self._threads:
            thread.join(timeout=30)
        if self._primed is not None:
            self._primed.clear()

    def feed(self, job: Job, item) -> None:
        with self._cond:
            job.text_inbox.append(item)
            self._lm_wake.notify()

    def take(self, job: Job):
        with self._cond:
            while not job.buffer:
                if self._closed and not self._workers_alive():
                    return RequestCancelledError("the engine was closed")
                self._cond.wait()
            item = job.buffer.popleft()
            self._vocoder_wake.notify_all()  # room in the buffer: the vocoder worker may resume this request
            return item

    def cancel(self, job: Job) -> None:
        with self._cond:
            if not job.done:
                job.cancelled = True
                self._lm_wake.notify()  # the LM worker ends it

    def _workers_alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def _ensure_workers(self) -> None:
        if self._threads:
            return
        cores = torch.get_num_threads()
        self._vocoder_workers, lm_threads, vocoder_threads = self.config.worker_layout(cores)
        self._cores, self._lm_threads, self._vocoder_threads = cores, lm_threads, vocoder_threads
        started = threading.Barrier(self._vocoder_workers + 2)  # the workers and this thread
        self._threads = [threading.Thread(target=self._worker, args=(self._run_lm, lm_threads, started),
                                          name="cadenza-lm", daemon=True)]
        for w in range(self._vocoder_workers):
            self._threads.append(threading.Thread(target=self._worker, name=f"cadenza-vocoder-{w}", daemon=True,
                                                  args=(functools.partial(self._run_vocoder, w), vocoder_threads,
                                                        started)))
        for thread in self._threads:
            thread.start()
        _wait(started)
        torch.set_num_threads(cores)  # a worker's count leaks into the process-wide default: give it back

    # -- both workers -------------------------------------------------------------------------------------------
    def _worker(self, loop, threads: int, started: threading.Barrier) -> None:
        torch.set_grad_enabled(False)
        # Under OpenMP the count is per thread, but a thread's first parallel op re-applies the process-wide value
        # (last set by any thread): run one first, then set this thread's count for good.
        torch.set_num_threads(threads)
        torch.zeros(1 << 16).add_(1)
        torch.set_num_threads(threads)
        _wait(started)
        try:
            with torch.inference_mode():
                loop()
        except Exception as exc:  # a bug in the worker itself: fail every request loudly instead of hanging
            log.exception("scheduler worker failed; closing the engine")
            with self._cond:
                self._closed = True
                for job in self._active + list(self._queued):
                    self._finish(job, exc)
                self._wake_all()  # consumers waiting on an empty buffer see the closed engine

    def _finish(self, job: Job, item) -> None:
        """Deliver the final item (``DONE`` or an exception); the workers free the job's state. Caller holds the
        lock."""
        if not job.done:
            job.done = True
            job.buffer.append(item)
        self._wake_all()  # its consumer; both workers free their halves

    def _wake_all(self) -> None:
        """Caller holds the lock."""
        self._cond.notify_all()
        self._lm_wake.notify()
        self._vocoder_wake.notify_all()

    def _end(self, jobs: list[Job], item) -> None:
        """``_finish`` each job with ``item``, taking the lock."""
        with self._cond:
            for job in jobs:
                self._finish(job, item)

    def _emit(self, job: Job, audio: np.ndarray) -> None:
        with self._cond:
            if job.done:  # ended meanwhile (cancelled, or failed in the other worker)
                return
            if job.first_chunk_s is None:
                job.first_chunk_s = time.perf_counter() - job.submitted
            job.chunks_out += 1
            self.chunks_emitted += 1
            job.buffer.append(audio)
            self._cond.notify_all()
            if job.chunks_out == 1:
                self._lm_wake.notify()  # first audio: requests paused for it may go on

    def _prune(self) -> None:
        """Drop released jobs: their slot is free at once. Caller holds the lock."""
        if any(j.released for j in self._active):
            self._active = [j for j in self._active if not j.released]
            self._lm_wake.notify()  # free slots: queued requests may start

    # -- LM worker ----------------------------------------------------------------------------------------------
    def _least_loaded_vocoder(self) -> int:
        """The vocoder worker with the fewest unfinished requests (a new request's flow and HiFT state lives in
        one worker for its whole life). Caller holds the lock."""
        load = [0] * self._vocoder_workers
        for job in self._active:
            if not job.vocoder_released:
                load[job.vocoder_worker] += 1
        return load.index(min(load))

    def _lm_competes(self, starting: int = 0) -> bool:
        """Whether the LM and the vocoder workers at work (plus ``starting`` more) need more threads than there are
        cores. Caller holds the lock."""
        return (self._vocoding + starting) * self._vocoder_threads + self._lm_threads > self._cores

    def _lm_has_work(self, job: Job) -> bool:
        """Caller holds the lock."""
        if job.done:
            return False
        if job.cancelled or job.text_inbox:
            return True
        if self._first_audio_pending and (job.chunks_out > 0 or self._awaits_first_audio(job)):
            return False  # another request's first audio is being made: it gets the cores
        return job.decoder is not None and not job.lm_done and job.decoder.next_input() is not None

    @staticmethod
    def _awaits_first_audio(job: Job) -> bool:
        """A streaming job has the tokens of its first chunk but not its audio yet."""
        return job.stream and job.chunks_out == 0 and not job.done and len(job.ids) >= job.first_chunk_tokens

    def _run_lm(self) -> None:
        while True:
            with self._cond:
                while True:
                    for job in self._active:
                        if job.done:
                            job.release_lm()  # the LM half of a finished / failed / cancelled request
                    self._prune()
                    if self._closed:
                        break
                    while self._queued and len(self._active) < self.config.max_active:
                        job = self._queued.popleft()
                        job.vocoder_worker = self._least_loaded_vocoder()
                        self._active.append(job)
                        self._vocoder_wake.notify_all()  # the vocoder worker sees the new job
                    # While a request has the tokens of its first chunk but no audio yet, the LM steps only requests
                    # that lack them too: the vocoder worker gets the cores for that first chunk (time to first
                    # audio as if the LM stood still), and the requests behind it catch up. ("contended": only
                    # while the LM would take a core from the vocoder workers at work; see SchedulerConfig.)
                    self._first_audio_pending = (any(self._awaits_first_audio(j) for j in self._active)
                                                 and (self.config.first_audio_pause == "always"
                                                      or self._lm_competes()))
                    if any(self._lm_has_work(j) for j in self._active):
                        break
                    if self._lm_busy:  # a flow chunk waiting for partners from the LM need not wait any more
                        self._lm_busy = False
                        self._vocoder_wake.notify_all()
                    self._lm_wake.wait()
                if self._closed:
                    for job in self._active + list(self._queued):
                        self._finish(job, RequestCancelledError("the engine was closed"))
                        job.release_lm()
                    for job in self._queued:
                        job.release_vocoder()  # never reached a vocoder worker: only a primed flow copy to free
                    self._queued.clear()
                    return
                self._lm_busy = True
                for job in self._active:
                    if job.cancelled:
                        self._finish(job, RequestCancelledError("cancelled"))
                active = [j for j in self._active if self._lm_has_work(j)]
                inboxes = {id(j): list(j.text_inbox) for j in active if j.text_inbox}
                for j in active:
                    j.text_inbox.clear()
            try:
                self._step(active, inboxes)
            except Exception as exc:  # a bug in batched LM work: fail those requests, keep serving
                log.exception("LM step failed")
                self._end(active, exc)
            with self._cond:
                self._lm_steps += 1
                self._vocoder_wake.notify_all()  # new tokens: a chunk may be ready

    def _step(self, active: list[Job], inboxes: dict[int, list]) -> None:
        """One LM step: deliver bistream text, then one decode step of every job with LM work."""
        for job in active:
            try:
                for item in inboxes.get(id(job), ()) if job.decoder is not None else ():
                    if isinstance(item, BaseException):
                        raise item
                    if item is DONE:
                        job.decoder.end_text()
                    else:
                        job.decoder.feed_text(item)
            except Exception as exc:
                self._end([job], exc)
            if job.decoder is not None and job.decoder.finished and not job.lm_done:
                self._lm_finished(job)  # e.g. a bistream request whose text ended with nothing to say
        lm_jobs = [j for j in active if not j.done and j.decoder is not None and not j.lm_done
                   and j.decoder.next_input() is not None]
        singles = [j for j in lm_jobs if j.decoder.next_input().shape[1] > 1]
        batch = [j for j in lm_jobs if j.decoder.next_input().shape[1] == 1]
        lm = self.model.lm
        for job in singles:
            try:
                hidden = lm.forward_hidden(job.decoder.next_input(), cache=job.decoder.cache)
                self._accept(job, lm.log_probs(hidden[:, -1])[0])
            except Exception as exc:
                self._end([job], exc)
        if batch:
            embeds = torch.cat([j.decoder.next_input() for j in batch], dim=0)
            hidden = lm.forward_hidden(embeds, cache=[j.decoder.cache for j in batch])
            logp = lm.log_probs(hidden[:, -1])
            for i, job in enumerate(batch):
                try:
                    self._accept(job, logp[i].clone())
                except Exception as exc:
                    self._end([job], exc)

    def _accept(self, job: Job, logp: torch.Tensor) -> None:
        token = job.decoder.accept(logp)
        if token is not None:
            job.ids.append(token)
        if job.decoder.finished:
            self._lm_finished(job)

    def _lm_finished(self, job: Job) -> None:
        job.release_lm()  # its KV caches are not needed any more
        with self._cond:
            job.lm_done = True  # after the last id is in job.ids: the vocoder worker may take the final chunk
            self._vocoder_wake.notify_all()
