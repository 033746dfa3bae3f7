"""The CosyVoice 2 scheduler's intake stage (``LMWorker``): admits queued requests, feeds bi-streaming text and runs
one LM step for every request that has LM work -- prompts (several new positions) one by one, then all single-token
decode steps together in one batched forward (per-request KV caches of any length).

While a request has the tokens of its first chunk but no audio yet, it steps only requests that lack them too, so the
vocoder workers get the cores for that first chunk (``SchedulerConfig.first_audio_pause``).
"""

from __future__ import annotations

import logging

import torch

from cadenza.engine.job_board import DONE, JobBoard
from cadenza.engine.lm_decode import DecodeStep
from cadenza.engine.pipeline_state import PipelineState
from cadenza.engine.scheduled_job import Job
from cadenza.errors import InputError, RequestCancelledError
from cadenza.models.cosyvoice2.model import CosyVoice2Model

log = logging.getLogger(__name__)


class LMWorker:
    def __init__(self, model: CosyVoice2Model, board: JobBoard, state: PipelineState,
                 decode_step: DecodeStep | None = None) -> None:
        """decode_step: the batched single-token step (``engine/lm_decode.py``; default: per-request caches)."""
        self.model, self.board, self.state = model, board, state
        self.decode_step = decode_step or DecodeStep(model.lm)
        self.config = board.config

    def _least_loaded_vocoder(self) -> int:
        """The vocoder worker with the fewest unfinished requests (a new request's flow and HiFT state lives in
        one worker for its whole life). Caller holds the lock."""
        load = [0] * self.state.vocoder_workers
        for job in self.board.active:
            if not job.vocoder_released:
                load[job.vocoder_worker] += 1
        return load.index(min(load))

    def has_work(self, job: Job) -> bool:
        """Caller holds the lock."""
        if job.done:
            return False
        if job.cancelled or job.text_inbox:
            return True
        if self.state.first_audio_pending and (job.chunks_out > 0 or awaits_first_audio(job)):
            return False  # another request's first audio is being made: it gets the cores
        return job.decoder is not None and not job.lm_done and job.decoder.next_input() is not None

    def run(self) -> None:
        board, state = self.board, self.state
        while True:
            with board.cond:
                while True:
                    for job in board.active:
                        if job.done:
                            job.release_lm()  # the LM half of a finished / failed / cancelled request
                    board.prune()
                    if board.closed:
                        break
                    while board.queued and len(board.active) < self.config.max_active:
                        job = board.queued[0]
                        job.vocoder_worker = self._least_loaded_vocoder()
                        board.admit_one()
                    # While a request has the tokens of its first chunk but no audio yet, the LM steps only requests
                    # that lack them too: the vocoder worker gets the cores for that first chunk (time to first
                    # audio as if the LM stood still), and the requests behind it catch up. ("contended": only
                    # while the LM would take a core from the vocoder workers at work; see SchedulerConfig.)
                    state.first_audio_pending = (any(awaits_first_audio(j) for j in board.active)
                                                 and (self.config.first_audio_pause == "always"
                                                      or state.lm_competes()))
                    if any(self.has_work(j) for j in board.active):
                        break
                    if state.lm_busy:  # a flow chunk waiting for partners from the LM need not wait any more
                        state.lm_busy = False
                        board.audio_wake.notify_all()
                    board.intake_wake.wait()
                if board.closed:
                    for job in board.active + list(board.queued):
                        board.finish(job, RequestCancelledError("the engine was closed"))
                        job.release_lm()
                    for job in board.queued:
                        job.release_vocoder()  # never reached a vocoder worker: only a primed flow copy to free
                    board.queued.clear()
                    return
                state.lm_busy = True
                for job in board.active:
                    if job.cancelled:
                        board.finish(job, RequestCancelledError("cancelled"))
                active = [j for j in board.active if self.has_work(j)]
                inboxes = {id(j): list(j.text_inbox) for j in active if j.text_inbox}
                for j in active:
                    j.text_inbox.clear()
            try:
                self.step(active, inboxes)
            except Exception as exc:  # a bug in batched LM work: fail those requests, keep serving
                log.exception("LM step failed")
                board.end(active, exc)
            with board.cond:
                state.lm_steps += 1
                board.audio_wake.notify_all()  # new tokens: a chunk may be ready

    def step(self, active: list[Job], inboxes: dict[int, list]) -> None:
        """One LM step: deliver bistream text, then one decode step of every job with LM work."""
        board = self.board
        for job in active:
            items = inboxes.get(id(job), ())
            try:
                if job.decoder is None:
                    self._source_tokens(job, items)
                else:
                    self._text(job, items)
            except Exception as exc:
                board.end([job], exc)
            if job.decoder is not None and job.decoder.finished and not job.lm_done:
                self._finished(job)  # e.g. a bistream request whose text ended with nothing to say
        lm_jobs = [j for j in active if not j.done and j.decoder is not None and not j.lm_done
                   and j.decoder.next_input() is not None]
        singles = [j for j in lm_jobs if j.decoder.next_input().shape[1] > 1]
        batch = [j for j in lm_jobs if j.decoder.next_input().shape[1] == 1]
        lm = self.model.lm
        for job in singles:
            try:
                self._accept(job, lm.next_log_probs(job.decoder.next_input(), job.decoder.cache)[0])
            except Exception as exc:
                board.end([job], exc)
        if batch:
            embeds = torch.cat([j.decoder.next_input() for j in batch], dim=0)
            logp = self.decode_step(embeds, [j.decoder.cache for j in batch])
            for i, job in enumerate(batch):
                try:
                    self._accept(job, logp[i].clone())
                except Exception as exc:
                    board.end([job], exc)

    @staticmethod
    def _text(job: Job, items: list) -> None:
        """Bi-streaming text as it arrives, into the job's decoder; ``DONE`` ends it."""
        for item in items:
            if isinstance(item, BaseException):
                raise item
            if item is DONE:
                job.decoder.end_text()
            else:
                job.decoder.feed_text(item)

    def _source_tokens(self, job: Job, items: list) -> None:
        """A live voice conversion's source tokens as they arrive (``SynthesisRequest.live_source``): they are its
        speech tokens, no LM runs; ``DONE`` ends them."""
        for item in items:
            if isinstance(item, BaseException):
                raise item
            if job.lm_done:
                continue  # nothing is added after the end
            if item is DONE:
                self._finished(job)
            elif len(job.ids) + len(item) > job.request.max_tokens:
                raise InputError(f"the live source passed the {job.request.max_tokens} speech tokens this stream can "
                                 "render")
            else:
                job.ids.extend(item)

    def _accept(self, job: Job, logp: torch.Tensor) -> None:
        token = job.decoder.accept(logp)
        if token is not None:
            job.ids.append(token)
        if job.decoder.finished:
            self._finished(job)

    def _finished(self, job: Job) -> None:
        job.release_lm()  # its KV caches are not needed any more
        with self.board.cond:
            job.lm_done = True  # after the last id is in job.ids: the vocoder worker may take the final chunk
            self.board.audio_wake.notify_all()


def awaits_first_audio(job: Job) -> bool:
    """A streaming job has the tokens of its first chunk but not its audio yet."""
    return job.stream and job.chunks_out == 0 and not job.done and len(job.ids) >= job.first_chunk_tokens
