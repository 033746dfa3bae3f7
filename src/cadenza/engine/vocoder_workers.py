"""The CosyVoice 2 scheduler's audio stage (``VocoderWorker``, one or more): picking a worker's next work among the
requests it owns (ready chunks, batched by frame count; flow ahead when nothing is ready) and running it (flow +
HiFT, then handing the audio to the consumer). Everything here runs on the worker's own thread; what it shares with
the LM worker is explicit: the ``JobBoard`` (jobs, lock, wake-ups) and the ``PipelineState`` (the LM's step count,
whether a first chunk is pending, the worker layout).
"""

from __future__ import annotations

import numpy as np
import torch

from cadenza.engine.job_board import DONE, JobBoard
from cadenza.engine.pipeline_state import PipelineState
from cadenza.engine.primed_prompts import PrimedPrompts
from cadenza.engine.scheduled_job import Job
from cadenza.engine.stream_schedule import StreamSchedule, steady_hops
from cadenza.engine.token2wav import StreamSynthesis, Token2Wav, flow_ahead_many, flow_mels, vocode_many
from cadenza.models.cosyvoice2.model import CosyVoice2Model

FLOW_AHEAD = object()  # marks vocoder work that computes a chunk's flow ahead (``_pick_flow_ahead``)
PRIME = object()  # marks vocoder work that primes a new stream's voice (``PrimedPrompts.prime``)


class VocoderWorker:
    """Vocoder worker number ``index``: owns the requests admitted to it (``Job.vocoder_worker``)."""

    def __init__(self, index: int, model: CosyVoice2Model, token2wav: Token2Wav, schedule: StreamSchedule,
                 board: JobBoard, state: PipelineState, primed: PrimedPrompts | None = None) -> None:
        self.index, self.model, self.token2wav, self.schedule = index, model, token2wav, schedule
        self.primed = primed
        self.board, self.state, self.config = board, state, board.config

    def run(self) -> None:
        board, state = self.board, self.state
        while True:
            with board.cond:
                while True:
                    mine = [j for j in board.active if j.vocoder_worker == self.index]
                    for job in mine:
                        if job.done and not job.vocoder_released:
                            job.release_vocoder()
                    board.prune()
                    if board.closed:
                        for job in mine:
                            job.release_vocoder()
                        return
                    work = self._pick(mine)
                    if work:
                        state.vocoding += 1
                        break
                    board.audio_wake.wait()
            try:
                self.vocode(work)
            finally:
                self._bound_flow_memory()
                with board.cond:
                    state.vocoding -= 1
                    if state.first_audio_pending:
                        board.intake_wake.notify()  # under "contended" the cores it used may be the LM's now

    def _bound_flow_memory(self) -> None:
        """Keep the cached flow state of every request together within ``flow_cache_budget``
        (``SchedulerConfig.flow_cache_budget_mb``): note what this worker's requests hold now, and while the total
        is past the budget free the largest of them; those streams go on recomputing the prefix per chunk (the same
        audio). Each worker frees only its own requests' state (no other thread touches it); the others' are
        counted as they last noted them."""
        budget = self.state.flow_cache_budget
        if budget is None:
            return
        with self.board.cond:
            mine = [j for j in self.board.active if j.vocoder_worker == self.index and not j.vocoder_released]
        for job in mine:
            job.flow_bytes = ((job.synth.flow_nbytes if job.synth is not None else 0)
                              + (job.flow_session.nbytes if job.flow_session is not None else 0))
        with self.board.cond:
            over = sum(j.flow_bytes for j in self.board.active if not j.vocoder_released) - budget
        for job in sorted(mine, key=lambda j: j.flow_bytes, reverse=True):
            if over <= 0:
                break
            if job.synth is not None and job.synth.flow_nbytes:  # a primed prompt not taken yet stays: it is small
                over -= job.flow_bytes
                job.synth.free_flow_cache(f"all requests past the flow cache budget of {budget / 2**20:.0f} MiB")
                job.flow_bytes = job.flow_session.nbytes if job.flow_session is not None else 0
                over += job.flow_bytes

    def _pick(self, mine: list[Job]) -> list[tuple[Job, int, bool]] | None:
        """The next vocoder work among one worker's jobs ``mine``: [(job, tokens available, final)] — the most
        urgent ready job and every ready job whose flow chunk has as many frames — or None (nothing ready, or
        waiting for batch partners). Caller holds the lock."""
        ready = []
        for job in mine:
            if job.done or job.cancelled or not self.board.room(job):
                continue
            if job.needs_priming:  # a stream's first work: its voice's flow prompt, while the LM decodes
                ready.append((job, 0, PRIME))
                continue
            lm_done = job.lm_done  # read before the ids: when it is set, every id is in
            n = len(job.ids)
            if job.stream and job.synth is None and not self._start_synthesis(job):
                continue
            if lm_done or (job.stream and job.synth.ready(n)):
                ready.append((job, n, lm_done and (not job.stream or not job.synth.ready(n))))
        if not ready:
            return self._pick_flow_ahead(mine)
        ready.sort(key=lambda r: (r[0].chunks_out > 0, r[0].seq))
        first = ready[0][0]
        frames = self._flow_frames(*ready[0]) if self.config.batch_streams else None
        if frames is None:
            first.ready_since = None
            return ready[:1]
        group = [r for r in ready if self._flow_frames(*r) == frames]
        if first.ready_since is None:
            first.ready_since = self.state.lm_steps
        waiting = [j for j in mine if j is not first and self._soon_ready(j, frames)]
        if (self.state.lm_busy and waiting
                and self.state.lm_steps - first.ready_since < self.config.flow_batch_wait_steps):
            return None  # woken by the LM worker after each step
        for job, _, _ in group:
            job.ready_since = None
        return group

    def _pick_flow_ahead(self, mine: list[Job]) -> list[tuple[Job, int, object]] | None:
        """Flow work ahead of a chunk for a worker with nothing ready (``SchedulerConfig.flow_ahead``): [(job, its
        tokens to compute, FLOW_AHEAD)] for the oldest stream that has some and every other whose push runs as many
        estimator frames (one batch, so streams that batch their chunks stay in step), or None. None while any
        stream waits for its first audio (that chunk must not queue behind work that can wait) and where it would
        share a core with the LM (the decoding it would slow is what the chunks wait for: measured, two vocoder
        workers computing ahead beside the LM on two cores lost 10-20 % at 2-8 streams). Caller holds the lock."""
        if (not self.config.flow_ahead or self.state.lm_competes(starting=1)
                or any(j.stream and j.chunks_out == 0 and not j.done for j in self.board.active)):
            return None
        work, frames = [], None
        for job in sorted(mine, key=lambda j: j.seq):
            if (job.done or job.cancelled or job.lm_done or not job.stream or job.synth is None
                    or not self.board.room(job)):
                continue
            n = job.synth.flow_ahead_tokens(len(job.ids))
            if n and frames in (None, (f := job.synth.flow_ahead_frames(n))):
                frames = f
                work.append((job, n, FLOW_AHEAD))
                if not self.config.batch_streams:
                    break
        return work or None

    def _start_synthesis(self, job: Job) -> bool:
        try:
            session, job.flow_session = job.flow_session, None
            # A live source keeps its hops at one attention chunk: longer ones would make it lag further behind.
            schedule = steady_hops(self.schedule) if job.request.live_source else self.schedule
            job.synth = StreamSynthesis(self.model, job.request.voice, schedule,
                                        lambda k, g=job.request.vocoder_generator: g, flow_session=session,
                                        speed=job.request.speed,
                                        split_chunks=self.config.flow_ahead and self.state.room_beside_lm)
            return True
        except Exception as exc:
            self.board.finish(job, exc)
            return False

    @staticmethod
    def _flow_frames(job: Job, n: int, final: bool) -> int | None:
        """Estimator frames of a streaming job's next flow chunk when it can join a batched flow call, else None."""
        if not job.stream or final is PRIME or (final and n == 0):
            return None
        return job.synth.flow_frames(n, final)

    def _soon_ready(self, job: Job, frames: int) -> bool:
        """Whether a job still in the LM gets a flow chunk of ``frames`` frames within the wait allowance."""
        synth = job.synth
        if job.done or job.lm_done or not job.stream or synth is None or job.request.live_source:
            return False
        if self.state.first_audio_pending and job.chunks_out > 0:
            return False  # paused by the LM worker until someone's first audio is out: it will not come closer
        n = len(job.ids)
        missing = synth.chunker.offset + synth.chunker.hop + synth.lookahead - n
        return 0 < missing <= self.config.flow_batch_wait_steps and synth.flow_frames(n, False) == frames

    def vocode(self, work: list[tuple[Job, int, bool]]) -> None:
        """Run one piece of picked work (a test may wrap this to watch or hold a worker)."""
        if work[0][2] is FLOW_AHEAD:
            self._flow_ahead(work)
        elif work[0][2] is PRIME:
            self._prime(work[0][0])
        elif len(work) > 1:
            self._vocoder_batch(work)
        else:
            self._vocoder_step(*work[0])

    def _flow_ahead(self, work: list[tuple[Job, int, object]]) -> None:
        """Flow of the next chunks ahead (``_pick_flow_ahead``): no audio yet, so nothing to emit."""
        jobs = [job for job, _, _ in work]
        try:
            flow_ahead_many([j.synth for j in jobs], [list(j.ids) for j in jobs], [n for _, n, _ in work])
        except Exception as exc:  # every state given may be half-updated
            self._end_vocoding(jobs, exc)
            return
        for job, n, _ in work:
            job.flow_ahead_tokens += n

    def _prime(self, job: Job) -> None:
        """Prime a new stream's voice (kept for the voice's next streams); the stream starts from a copy."""
        try:
            session = self.primed.prime(job.request.voice)
        except Exception as exc:
            self._end_vocoding([job], exc)
            return
        with self.board.cond:
            job.flow_session, job.needs_priming = session, False  # freed with the job if it ended meanwhile

    def _vocoder_batch(self, work: list[tuple[Job, int, bool]]) -> None:
        """The next chunk of several streaming jobs: their flow pushes together (``flow_mels``), then their HiFT calls
        (``vocode_many``: batched where the mel lengths match)."""
        jobs = [job for job, _, _ in work]
        finals = [final for _, _, final in work]
        try:
            mels = flow_mels([j.synth for j in jobs], [j.ids[:n] for j, n, _ in work], finals)
            chunks = vocode_many([j.synth for j in jobs], mels, finals)
        except Exception as exc:  # a batched call failed: every state given may be half-updated
            self._end_vocoding(jobs, exc)
            return
        for job, audio in zip(jobs, chunks):
            self.board.emit(job, audio)
        self._end_vocoding([job for job, final in zip(jobs, finals) if final], DONE)

    def _vocoder_step(self, job: Job, n: int, final: bool) -> None:
        try:
            ids = job.ids[:n]
            if not job.stream:
                audio = (self.token2wav.full(torch.tensor([ids]), job.request.voice, job.request.speed,
                                             job.request.vocoder_generator)
                         if ids else np.zeros(0, dtype=np.float32))
                self.board.emit(job, audio)
            elif not final:
                self.board.emit(job, job.synth.next_chunk(ids))
            elif ids:  # the remaining tokens and the held-back overlap of the previous chunk
                self.board.emit(job, job.synth.finish(ids))
        except Exception as exc:
            self._end_vocoding([job], exc)
            return
        if final or not job.stream:
            self._end_vocoding([job], DONE)

    def _end_vocoding(self, jobs: list[Job], item) -> None:
        """Free the vocoder half of ended jobs, then deliver their final item: a consumer that sees the end finds
        the slot free (the LM half of a job that reaches its last chunk is freed already)."""
        for job in jobs:
            job.release_vocoder()
        with self.board.cond:
            for job in jobs:
                self.board.finish(job, item)
            self.board.prune()
