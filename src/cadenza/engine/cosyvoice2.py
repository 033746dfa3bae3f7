"""Runs CosyVoice 2 requests: resolve the mode, generate speech tokens with the LM, turn them into audio."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import torch

from cadenza.audio.speed_range import speed_in_range
from cadenza.engine.precision import Precision, apply_precision
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.scheduler import Scheduler, SchedulerConfig
from cadenza.engine.stream_handle import StreamHandle
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.engine.token2wav import Token2Wav
from cadenza.errors import InputError, TextError
from cadenza.models.cosyvoice2.frontend import CosyVoice2Frontend
from cadenza.models.cosyvoice2.model import CosyVoice2Model
from cadenza.models.cosyvoice2.sampling import ras_sampling
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt, SpeakerStore

log = logging.getLogger(__name__)

MAX_TEXT_TOKENS = 1000  # per request; longer text must be split into sentences first


class CosyVoice2Engine:
    """Stateless between requests: all per-utterance state lives in the ``SynthesisRequest`` and local variables."""

    def __init__(self, model: CosyVoice2Model, frontend: CosyVoice2Frontend, speakers: SpeakerStore,
                 schedule: StreamSchedule | None = None, scheduler_config: SchedulerConfig | None = None,
                 precision: Precision | None = None) -> None:
        """precision: convert ``model`` (float32, in place) to it before anything runs (``engine/precision.py``);
        None or ``Precision()``: float32, untouched."""
        self.precision = precision or Precision()
        if not self.precision.is_float32:
            apply_precision(model, self.precision)
            log.info("CosyVoice 2 precision: %s", self.precision.describe())
        self.model = model
        self.frontend = frontend
        self.speakers = speakers
        self.schedule = schedule or StreamSchedule()
        self.token2wav = Token2Wav(model, self.schedule)
        self.config = model.config
        self.scheduler = Scheduler(model, self.schedule, scheduler_config)

    def close(self) -> None:
        self.scheduler.close()

    # -- building requests ---------------------------------------------------------------------------------------
    def empty_voice(self) -> SpeakerPrompt:
        """No prompt at all: zero x-vector, no prompt tokens (an arbitrary voice; used when none is given)."""
        empty = torch.zeros(1, 0, dtype=torch.long)
        return SpeakerPrompt(empty, empty, empty, torch.zeros(1, 0, self.config.mel.num_mels),
                             torch.zeros(1, self.config.flow.spk_embed_dim))

    def speech_capacity(self, voice: SpeakerPrompt) -> int:
        """Speech tokens one utterance may have after ``voice``'s prompt: the flow's noise is a fixed buffer of
        ``noise_frames`` mel frames, which the prompt and the speech share."""
        cfg = self.config
        return cfg.flow.cfm.noise_frames // cfg.token_mel_ratio - voice.flow_prompt_speech.shape[1]

    def check_text_ids(self, ids, what: str = "text_ids") -> torch.Tensor:
        t = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
        if t.numel() == 0:
            raise TextError(f"{what} is empty")
        vocab = self.config.lm.qwen.vocab_size
        if int(t.min()) < 0 or int(t.max()) >= vocab:
            raise TextError(f"{what} must be ids in [0, {vocab}), got range [{int(t.min())}, {int(t.max())}]")
        return t

    def check_speech_ids(self, ids, what: str) -> torch.Tensor:
        t = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
        size = self.config.lm.speech_token_size
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= size):
            raise InputError(f"{what} must be speech token ids in [0, {size})")
        return t

    def build(self, *, text_ids: torch.Tensor, voice: SpeakerPrompt | None, mode: str,
              lm_prompt_text: torch.Tensor | None = None, lm_prompt_speech: torch.Tensor | None = None,
              seed: int | None = None, speed: float = 1.0) -> SynthesisRequest:
        speed_in_range(speed)
        if text_ids.shape[1] > MAX_TEXT_TOKENS:
            raise TextError(f"text is {text_ids.shape[1]} tokens; at most {MAX_TEXT_TOKENS} per request (split it)")
        voice = voice or self.empty_voice()
        cfg = self.config
        n_text = text_ids.shape[1]
        min_tokens = int(n_text * cfg.lm.min_token_text_ratio)
        capacity = self.speech_capacity(voice)  # generation must stay inside the flow's fixed noise
        if min_tokens > capacity:
            raise TextError(f"text too long for one request: it needs at least {min_tokens} speech tokens but the "
                            f"model can make {capacity} after this prompt; split the text")
        max_tokens = min(int(n_text * cfg.lm.max_token_text_ratio), capacity)
        empty = torch.zeros(1, 0, dtype=torch.long)
        return SynthesisRequest(
            mode=mode, voice=voice, text_ids=text_ids,
            lm_prompt_text=empty if lm_prompt_text is None else lm_prompt_text,
            lm_prompt_speech=empty if lm_prompt_speech is None else lm_prompt_speech,
            speed=speed, seed=seed, min_tokens=min_tokens, max_tokens=max_tokens,
        )

    def build_bistream(self, *, voice: SpeakerPrompt | None, mode: str, lm_prompt_text: torch.Tensor | None = None,
                       lm_prompt_speech: torch.Tensor | None = None, seed: int | None = None,
                       speed: float = 1.0) -> SynthesisRequest:
        """A request whose text arrives later (its length limits are applied as the text comes in)."""
        speed_in_range(speed)
        voice = voice or self.empty_voice()
        capacity = self.speech_capacity(voice)
        empty = torch.zeros(1, 0, dtype=torch.long)
        return SynthesisRequest(
            mode=mode, voice=voice, text_ids=None,
            lm_prompt_text=empty if lm_prompt_text is None else lm_prompt_text,
            lm_prompt_speech=empty if lm_prompt_speech is None else lm_prompt_speech,
            seed=seed, max_tokens=capacity, speed=speed,
        )

    # -- running them --------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def speech_tokens(self, request: SynthesisRequest) -> Iterator[int]:
        """Speech token ids of the request, one at a time as the LM produces them."""
        if request.source_tokens is not None:
            yield from request.source_tokens[0].tolist()
            return
        sampling = self.config.lm.sampling
        gen = request.generator

        def sampler(logp: torch.Tensor, history: list[int]) -> int:
            return ras_sampling(logp, history, sampling, generator=gen)

        yield from self.model.lm.generate(
            request.text_ids, request.lm_prompt_text, request.lm_prompt_speech, sampler=sampler,
            min_len=request.min_tokens, max_len=request.max_tokens,
        )

    # Through the scheduler (concurrent requests share batched LM steps) --------------------------------------
    def synthesize(self, request: SynthesisRequest) -> np.ndarray:
        """The whole utterance at once (flow without chunk masks)."""
        chunks = list(self.scheduler.submit(request, stream=False))
        return chunks[0] if chunks else np.zeros(0, dtype=np.float32)

    def stream(self, request: SynthesisRequest) -> Iterator[np.ndarray]:
        """Audio chunks as soon as each is ready."""
        return iter(self.scheduler.submit(request, stream=True))

    def stream_bistream(self, request: SynthesisRequest) -> StreamHandle:
        """A request whose text arrives later: feed ids with ``handle.feed_text``, then ``handle.end_text()``."""
        return self.scheduler.submit(request, stream=True, bistream=True)

    # Direct, single-request paths in the caller's thread (reference behaviour; baselines for tests) ---------------
    def synthesize_direct(self, request: SynthesisRequest) -> np.ndarray:
        tokens = list(self.speech_tokens(request))
        if not tokens:
            log.warning("the LM produced no speech tokens (mode %s)", request.mode)
            return np.zeros(0, dtype=np.float32)
        return self.token2wav.full(torch.tensor([tokens]), request.voice, request.speed, request.vocoder_generator)

    def stream_direct(self, request: SynthesisRequest) -> Iterator[np.ndarray]:
        gen = request.vocoder_generator
        yield from self.token2wav.stream(self.speech_tokens(request), request.voice, lambda k: gen, request.speed)
