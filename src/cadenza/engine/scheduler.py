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
  chunks ahead, up to each chunk's split point once the tokens decoded so far fix it (``SchedulerConfig.flow_ahead``;
  the same audio bit for bit), unless a stream waits for its first audio.

The stages are composed over explicit shared state: ``JobBoard`` (``job_board.py``: queued and active jobs, the
lock and its wake-up lists, the consumers' side), ``PipelineState`` (what the LM and vocoder workers tell each
other), ``LMWorker`` (``lm_worker.py``) and ``VocoderWorker`` (``vocoder_workers.py``).

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

import logging

import torch

from cadenza.engine.job_board import JobBoard
from cadenza.engine.lm_decode import DecodeStep
from cadenza.engine.lm_worker import LMWorker
from cadenza.engine.memory_budget import flow_cache_budget
from cadenza.engine.pipeline_state import PipelineState
from cadenza.engine.primed_prompts import PrimedPrompts
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.scheduled_job import Job
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.engine.stream_handle import StreamHandle
from cadenza.engine.stream_schedule import StreamSchedule, TokenChunker
from cadenza.engine.token2wav import Token2Wav
from cadenza.engine.vocoder_workers import VocoderWorker
from cadenza.layers.kv_pool import KVPool
from cadenza.models.cosyvoice2.lm_decoding import BistreamDecoder, UnistreamDecoder
from cadenza.models.cosyvoice2.model import CosyVoice2Model
from cadenza.models.cosyvoice2.sampling import RasSampler

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, model: CosyVoice2Model, schedule: StreamSchedule | None = None,
                 config: SchedulerConfig | None = None) -> None:
        self.model = model
        self.schedule = schedule or StreamSchedule()
        self.config = config or SchedulerConfig()
        self.token2wav = Token2Wav(model, self.schedule)
        self._primed = (PrimedPrompts(model.flow, int(self.schedule.primed_prompt_cache_mb * 2**20))
                        if self.schedule.incremental and self.schedule.primed_prompt_cache_mb > 0
                        and model.flow.decoder.estimator.supports_cache else None)
        self.board = JobBoard(self.config)
        self.state = PipelineState()
        self.decode_step = lm_decode_step(model, self.config)
        self.lm_worker = LMWorker(model, self.board, self.state, self.decode_step)
        self.vocoders: list[VocoderWorker] = []  # made when the workers start (their number depends on the cores)

    @property
    def chunks_emitted(self) -> int:
        """Audio chunks handed to consumers so far, all requests (a work counter for tests)."""
        return self.board.chunks_emitted

    # -- consumer side (any thread) ------------------------------------------------------------------------------
    def submit(self, request: SynthesisRequest, stream: bool = True, bistream: bool = False,
               reference_quirks: bool = False) -> StreamHandle:
        """Queue a request. ``bistream``: text arrives later through the handle's ``feed_text``/``end_text``."""
        with torch.no_grad():  # the prompt embeddings are built here, in the caller's thread
            decoder = self._decoder(request, bistream, reference_quirks)
        # A stream starts from its voice's primed flow state; one not kept yet is computed by the request's vocoder
        # worker while the LM decodes the first chunk's tokens (not here: the LM would wait for it).
        session = self._primed.cached(request.voice) if stream and self._primed is not None else None
        job = Job(request=request, stream=stream, decoder=decoder,
                  first_chunk_tokens=self._first_chunk_tokens(request), flow_session=session,
                  needs_priming=stream and self._primed is not None and session is None)
        if decoder is None:  # voice conversion: its tokens are given (a live source's more as it is recorded)
            job.ids, job.lm_done = list(request.source_tokens[0].tolist()), not request.live_source
        self.board.enqueue(job, self._ensure_workers)
        return StreamHandle(self.board, job)

    def _decoder(self, request: SynthesisRequest, bistream: bool,
                 reference_quirks: bool) -> UnistreamDecoder | BistreamDecoder | None:
        """The LM decoder of a request (None for voice conversion, which has its speech tokens already)."""
        if request.source_tokens is not None:
            return None
        sampler = RasSampler(self.model.config.lm.sampling, request.generator)
        lm = self.model.lm
        cache = self.decode_step.new_cache()
        if bistream:
            return BistreamDecoder(lm, request.lm_prompt_text, request.lm_prompt_speech, sampler,
                                   reference_quirks=reference_quirks, capacity=request.max_tokens, cache=cache)
        return UnistreamDecoder(lm, request.text_ids, request.lm_prompt_text, request.lm_prompt_speech,
                                sampler, request.min_tokens, request.max_tokens, cache=cache)

    def _first_chunk_tokens(self, request: SynthesisRequest) -> int:
        """Speech tokens a streaming request needs for its first chunk (first hop + look-ahead)."""
        lookahead = self.model.config.flow.pre_lookahead_len
        chunker = TokenChunker(self.schedule, request.voice.flow_prompt_speech.shape[1], lookahead)
        return chunker.hop + lookahead

    def forget_prompt(self, prompt) -> None:
        """Drop the primed flow state of a voice's prompt (its voice was deleted)."""
        if self._primed is not None:
            self._primed.forget(prompt)

    @property
    def load(self) -> tuple[int, int]:
        """(active, queued) request counts; a request is active until its state is freed."""
        return self.board.load

    def close(self) -> None:
        self.board.close()
        if self._primed is not None:
            self._primed.clear()

    def _ensure_workers(self) -> None:
        """Start the LM worker and the vocoder workers (on the first request). Caller holds the board's lock."""
        if self.board.threads:
            return
        state = self.state
        state.cores = torch.get_num_threads()
        state.vocoder_workers, state.lm_threads, state.vocoder_threads = self.config.worker_layout(state.cores)
        state.flow_cache_budget = flow_cache_budget(self.config.flow_cache_budget_mb,
                                                    next(self.model.flow.parameters()).device)
        self.vocoders = [VocoderWorker(w, self.model, self.token2wav, self.schedule, self.board, state, self._primed)
                         for w in range(state.vocoder_workers)]
        loops = [("cadenza-lm", self.lm_worker.run, state.lm_threads)]
        loops += [(f"cadenza-vocoder-{w.index}", w.run, state.vocoder_threads) for w in self.vocoders]
        self.board.start(loops)


def lm_decode_step(model: CosyVoice2Model, config: SchedulerConfig) -> DecodeStep:
    """The LM worker's batched decode step: a KV pool (and CUDA graphs) where ``config`` asks for them or, left
    unset, where the model is on a CUDA device (``SchedulerConfig.lm_kv_pool``)."""
    lm = model.lm
    on_cuda = lm.device.type == "cuda"
    use_pool = config.lm_kv_pool if config.lm_kv_pool is not None else on_cuda
    graphs = config.lm_cuda_graphs if config.lm_cuda_graphs is not None else on_cuda and use_pool
    if graphs and not (on_cuda and use_pool):
        raise ValueError("lm_cuda_graphs needs the LM on a CUDA device and lm_kv_pool")
    if not use_pool:
        return DecodeStep(lm)
    qwen = model.config.lm.qwen
    pool = KVPool(qwen.num_hidden_layers, qwen.num_key_value_heads, qwen.head_dim, config.max_active,
                  config.lm_pool_positions, dtype=lm.llm_embedding.weight.dtype, device=lm.device)
    return DecodeStep(lm, pool, cuda_graphs=graphs)
