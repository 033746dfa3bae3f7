"""The request scheduler: one worker thread runs the model for every active request, batching their LM steps.

Each loop of the worker (``_step``):
1. drops cancelled requests (freeing their KV caches, flow and vocoder state);
2. runs one LM step for every request that has LM work: prompts (several new positions) one by one, then all
   single-token decode steps together in one batched forward (per-request KV caches of any length);
3. runs the flow + HiFT work of one request that has enough tokens for its next chunk — requests still waiting
   for their first chunk go first, then the oldest — together with the requests whose flow chunk has as many frames
   (their flow estimator calls run as one batch, ``IncrementalFlow.push_many``, and so do their HiFT calls where the
   mel lengths match, ``vocode_many``), or of all of them when no LM work is waiting.

Consumers read chunks from a bounded per-request buffer; a request whose buffer is full is not given vocoder work
until its consumer reads (a slow reader never holds up anyone else). New requests beyond ``max_active`` wait in a
bounded queue; beyond that ``submit`` raises ``EngineBusyError``. Nothing sleeps or polls: all hand-offs go through
one condition variable.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from cadenza.engine.request import SynthesisRequest
from cadenza.engine.token2wav import StreamSchedule, StreamSynthesis, Token2Wav, flow_mels, vocode_many
from cadenza.errors import CadenzaError, EngineBusyError, RequestCancelledError
from cadenza.models.cosyvoice2.lm_decoding import BistreamDecoder, UnistreamDecoder
from cadenza.models.cosyvoice2.model import CosyVoice2Model
from cadenza.models.cosyvoice2.sampling import RasSampler

log = logging.getLogger(__name__)
_DONE = object()


@dataclass(frozen=True)
class SchedulerConfig:
    max_active: int = 8  # requests decoded together
    max_queued: int = 32  # requests waiting for a slot; more -> EngineBusyError
    max_buffered_chunks: int = 16  # per request, audio chunks not yet read by the consumer
    # A request whose flow chunk is ready waits up to this many LM steps for requests a few tokens short of a chunk
    # of the same size, so their flows run as one batch (cheaper than one after the other); 0 = never wait.
    flow_batch_wait_steps: int = 4

    def __post_init__(self) -> None:
        if self.max_active < 1 or self.max_queued < 0 or self.max_buffered_chunks < 1 or self.flow_batch_wait_steps < 0:
            raise ValueError("bad scheduler limits")


@dataclass(eq=False)
class _Job:
    """One request's live state inside the scheduler (only the worker touches the model-side fields)."""

    request: SynthesisRequest
    stream: bool
    decoder: UnistreamDecoder | BistreamDecoder | None
    synth: StreamSynthesis | None = None
    ids: list[int] = field(default_factory=list)
    lm_done: bool = False
    done: bool = False
    cancelled: bool = False
    chunks_out: int = 0
    text_inbox: collections.deque = field(default_factory=collections.deque)  # bistream text ids / _DONE
    buffer: collections.deque = field(default_factory=collections.deque)  # audio chunks / exception / _DONE
    seq: int = 0
    flow_waits: int = 0  # LM steps this job's ready flow chunk has waited for batch partners
    submitted: float = field(default_factory=time.perf_counter)
    first_chunk_s: float | None = None

    def close(self) -> None:
        if self.decoder is not None:
            self.decoder.close()
        if self.synth is not None:
            self.synth.close()
        self.decoder = self.synth = None


class StreamHandle:
    """Iterate for float32 audio chunks. ``close()``/``cancel()`` (or dropping the iterator) frees the request.

    For bi-streaming requests, ``feed_text(ids)`` and ``end_text()`` deliver the text as it arrives.
    """

    def __init__(self, scheduler: Scheduler, job: _Job) -> None:
        self._scheduler, self._job = scheduler, job

    @property
    def first_chunk_seconds(self) -> float | None:
        return self._job.first_chunk_s

    def feed_text(self, ids: torch.Tensor) -> None:
        self._scheduler._feed(self._job, ids)

    def end_text(self) -> None:
        self._scheduler._feed(self._job, _DONE)

    def fail(self, exc: BaseException) -> None:
        """The text source failed: end the request with ``exc`` (the consumer sees it)."""
        self._scheduler._feed(self._job, exc)

    def __iter__(self) -> Iterator[np.ndarray]:
        try:
            while (item := self._scheduler._take(self._job)) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()

    def cancel(self) -> None:
        self._scheduler._cancel(self._job)


class Scheduler:
    def __init__(self, model: CosyVoice2Model, schedule: StreamSchedule | None = None,
                 config: SchedulerConfig | None = None) -> None:
        self.model = model
        self.schedule = schedule or StreamSchedule()
        self.config = config or SchedulerConfig()
        self.token2wav = Token2Wav(model, self.schedule)
        self._cond = threading.Condition()
        self._queued: collections.deque[_Job] = collections.deque()
        self._active: list[_Job] = []
        self._seq = itertools.count()
        self._closed = False
        self._thread: threading.Thread | None = None

    # -- consumer side (any thread) ------------------------------------------------------------------------------
    def submit(self, request: SynthesisRequest, stream: bool = True, bistream: bool = False,
               reference_quirks: bool = False) -> StreamHandle:
        """Queue a request. ``bistream``: text arrives later through the handle's ``feed_text``/``end_text``."""
        with torch.no_grad():  # the prompt embeddings are built here, in the caller's thread
            decoder = self._decoder(request, bistream, reference_quirks)
        job = _Job(request=request, stream=stream, decoder=decoder, seq=next(self._seq))
        if decoder is None:
            job.ids, job.lm_done = list(request.source_tokens[0].tolist()), True
        with self._cond:
            if self._closed:
                raise CadenzaError("the engine is closed")
            if len(self._queued) >= self.config.max_queued and len(self._active) >= self.config.max_active:
                job.close()
                raise EngineBusyError(f"busy: {len(self._active)} requests running and {len(self._queued)} queued")
            self._queued.append(job)
            self._ensure_worker()
            self._cond.notify_all()
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

    @property
    def load(self) -> tuple[int, int]:
        """(active, queued) request counts."""
        with self._cond:
            return sum(not j.done for j in self._active), len(self._queued)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _feed(self, job: _Job, item) -> None:
        with self._cond:
            job.text_inbox.append(item)
            self._cond.notify_all()

    def _take(self, job: _Job):
        with self._cond:
            while not job.buffer:
                if self._closed and not self._thread_alive():
                    return RequestCancelledError("the engine was closed")
                self._cond.wait()
            item = job.buffer.popleft()
            self._cond.notify_all()  # room in the buffer: the worker may resume this request
            return item

    def _cancel(self, job: _Job) -> None:
        with self._cond:
            if not job.done:
                job.cancelled = True
                self._cond.notify_all()

    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _ensure_worker(self) -> None:
        if not self._thread_alive():
            self._thread = threading.Thread(target=self._run, name="cadenza-scheduler", daemon=True)
            self._thread.start()

    # -- worker side ----------------------------------------------------------------------------------------------
    def _has_work(self, job: _Job) -> bool:
        if job.cancelled or job.text_inbox:
            return True
        if job.decoder is not None and not job.lm_done and job.decoder.next_input() is not None:
            return True
        return self._vocoder_ready(job)

    def _vocoder_ready(self, job: _Job) -> bool:
        if job.done or len(job.buffer) >= self.config.max_buffered_chunks:
            return False
        if job.lm_done:
            return True
        return job.stream and job.synth is not None and job.synth.ready(len(job.ids))

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                while not self._closed:
                    self._active = [j for j in self._active if not j.done]  # finished jobs free their slot now
                    while self._queued and len(self._active) < self.config.max_active:
                        self._active.append(self._queued.popleft())
                    if any(self._has_work(j) for j in self._active):
                        break
                    self._cond.wait()
                if self._closed:
                    for job in self._active + list(self._queued):
                        self._finish(job, RequestCancelledError("the engine was closed"))
                    self._active.clear()
                    self._queued.clear()
                    return
                inboxes = {id(j): list(j.text_inbox) for j in self._active if j.text_inbox}
                for j in self._active:
                    j.text_inbox.clear()
            try:
                with torch.inference_mode():
                    self._step(inboxes)
            except Exception as exc:  # a bug in batched work: fail every active request, keep serving
                log.exception("scheduler step failed")
                with self._cond:
                    for job in self._active:
                        self._finish(job, exc)
                    self._active = []

    def _finish(self, job: _Job, item) -> None:
        """Deliver the final item (``_DONE`` or an exception) and free the job. Caller holds the lock."""
        job.close()
        if not job.done:
            job.done = True
            job.buffer.append(item)
        self._cond.notify_all()

    def _emit(self, job: _Job, audio: np.ndarray) -> None:
        with self._cond:
            if job.first_chunk_s is None:
                job.first_chunk_s = time.perf_counter() - job.submitted
            job.chunks_out += 1
            job.buffer.append(audio)
            self._cond.notify_all()

    def _step(self, inboxes: dict[int, list]) -> None:
        with self._cond:
            for job in [j for j in self._active if j.cancelled]:
                self._finish(job, RequestCancelledError("cancelled"))
            self._active = [j for j in self._active if not j.done]
            active = list(self._active)
        for job in active:
            try:
                for item in inboxes.get(id(job), ()):
                    if isinstance(item, BaseException):
                        raise item
                    if item is _DONE:
                        job.decoder.end_text()
                    else:
                        job.decoder.feed_text(item)
            except Exception as exc:
                with self._cond:
                    self._finish(job, exc)
            if job.decoder is not None and job.decoder.finished and not job.lm_done:
                job.lm_done = True  # e.g. a bistream request whose text ended with nothing to say
        active = [j for j in active if not j.done]
        lm_jobs = [j for j in active if j.decoder is not None and not j.lm_done and j.decoder.next_input() is not None]
        for job in active:
            try:
                if job.stream and job.synth is None:
                    job.synth = StreamSynthesis(self.model, job.request.voice, self.schedule,
                                                lambda k, g=job.request.vocoder_generator: g)
            except Exception as exc:
                with self._cond:
                    self._finish(job, exc)
        self._lm_step([j for j in lm_jobs if not j.done])
        ready = sorted((j for j in active if not j.done and self._vocoder_ready(j)),
                       key=lambda j: (j.chunks_out > 0, j.seq))
        if lm_jobs and ready:
            # Keep the LM moving for everyone: only the most urgent vocoder job, plus the jobs whose flow chunk can
            # share its batched estimator calls (equal frame counts: almost free on top of it).
            frames = self._flow_frames(ready[0])
            ready = ready[:1] + [j for j in ready[1:] if frames is not None and self._flow_frames(j) == frames]
            if frames is not None and ready[0].flow_waits < self.config.flow_batch_wait_steps and any(
                self._soon_ready(j, frames) for j in lm_jobs if not j.done
            ):
                ready[0].flow_waits += 1
                ready = []
        for job in ready:
            job.flow_waits = 0
        batchable = [j for j in ready if self._flow_frames(j) is not None]
        if len(batchable) > 1:
            self._vocoder_batch(batchable)
        for job in ready:
            if not any(job is j for j in batchable) or len(batchable) == 1:
                self._vocoder_step(job)

    @staticmethod
    def _chunk_is_final(job: _Job) -> bool:
        return not job.synth.ready(len(job.ids))

    def _flow_frames(self, job: _Job) -> int | None:
        """Estimator frames of a streaming job's next flow chunk when it can join a batched flow call, else None."""
        if not job.stream or job.synth is None or (self._chunk_is_final(job) and not job.ids):
            return None
        return job.synth.flow_frames(len(job.ids), self._chunk_is_final(job))

    def _soon_ready(self, job: _Job, frames: int) -> bool:
        """Whether a job still in the LM gets a flow chunk of ``frames`` frames within the wait allowance."""
        synth = job.synth
        if not job.stream or synth is None or self._vocoder_ready(job):
            return False
        missing = synth.chunker.offset + synth.chunker.hop + synth.lookahead - len(job.ids)
        return missing <= self.config.flow_batch_wait_steps and synth.flow_frames(len(job.ids), False) == frames

    def _vocoder_batch(self, jobs: list[_Job]) -> None:
        """The next chunk of several streaming jobs: their flow pushes together (``flow_mels``), then their HiFT calls
        (``vocode_many``: batched where the mel lengths match)."""
        finals = [self._chunk_is_final(j) for j in jobs]
        try:
            mels = flow_mels([j.synth for j in jobs], [j.ids for j in jobs], finals)
        except Exception as exc:  # the batched push closes every session it was given
            with self._cond:
                for job in jobs:
                    self._finish(job, exc)
            return
        try:
            chunks = vocode_many([j.synth for j in jobs], mels, finals)
        except Exception as exc:  # a batched HiFT call failed: the jobs' vocoder states may be half-updated
            with self._cond:
                for job in jobs:
                    self._finish(job, exc)
            return
        for job, audio, final in zip(jobs, chunks, finals):
            self._emit(job, audio)
            if final:
                with self._cond:
                    self._finish(job, _DONE)

    def _lm_step(self, jobs: list[_Job]) -> None:
        lm = self.model.lm
        singles = [j for j in jobs if j.decoder.next_input().shape[1] > 1]
        batch = [j for j in jobs if j.decoder.next_input().shape[1] == 1]
        for job in singles:
            try:
                hidden = lm.forward_hidden(job.decoder.next_input(), cache=job.decoder.cache)
                self._accept(job, lm.log_probs(hidden[:, -1])[0])
            except Exception as exc:
                with self._cond:
                    self._finish(job, exc)
        if batch:
            embeds = torch.cat([j.decoder.next_input() for j in batch], dim=0)
            hidden = lm.forward_hidden(embeds, cache=[j.decoder.cache for j in batch])
            logp = lm.log_probs(hidden[:, -1])
            for i, job in enumerate(batch):
                try:
                    self._accept(job, logp[i].clone())
                except Exception as exc:
                    with self._cond:
                        self._finish(job, exc)

    def _accept(self, job: _Job, logp: torch.Tensor) -> None:
        token = job.decoder.accept(logp)
        if token is not None:
            job.ids.append(token)
        if job.decoder.finished:
            job.lm_done = True
            job.decoder.close()

    def _vocoder_step(self, job: _Job) -> None:
        try:
            if not job.stream:
                audio = (self.token2wav.full(torch.tensor([job.ids]), job.request.voice, job.request.speed,
                                             job.request.vocoder_generator)
                         if job.ids else np.zeros(0, dtype=np.float32))
                self._emit(job, audio)
                last = True
            elif job.synth.ready(len(job.ids)):
                self._emit(job, job.synth.next_chunk(job.ids))
                last = False
            else:
                if job.ids:
                    self._emit(job, job.synth.finish(job.ids))
                last = True
        except Exception as exc:
            with self._cond:
                self._finish(job, exc)
            return
        if last:
            with self._cond:
                self._finish(job, _DONE)
