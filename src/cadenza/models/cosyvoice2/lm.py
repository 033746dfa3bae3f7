"""The CosyVoice 2 text-speech language model (``Qwen2LM`` of the reference).

Structure and layouts: docs/design.md, "CosyVoice 2 LM structure" and "CosyVoice 2 LM sequence layouts".

A Qwen2 body reads one sequence that mixes text embeddings (Qwen's ``embed_tokens``), two learned markers
(``llm_embedding``: row 0 = sos, row 1 = task_id "start speaking") and speech-token embeddings; a linear head
(``llm_decoder``) scores ``speech_token_size + 3`` ids: the speech tokens, eos, an unused id and fill (the
bistream "give me more text" marker).

Checkpoint: ``llm.pt`` loads with ``strict=True`` after removing ``TIED_LM_HEAD_KEY`` (HF's ``lm_head``, tied to
``embed_tokens`` and never used by CosyVoice 2, so this module does not build it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping

import torch
from torch import nn

from cadenza.layers.embedding import Embedding
from cadenza.layers.kv_cache import KVCache
from cadenza.models.cosyvoice2.config import LMConfig
from cadenza.models.cosyvoice2.lm_decoding import BistreamDecoder, Sampler, UnistreamDecoder
from cadenza.models.cosyvoice2.qwen2 import Qwen2Encoder
from cadenza.models.cosyvoice2.sampling import RasSampler

logger = logging.getLogger(__name__)

TIED_LM_HEAD_KEY = "llm.model.lm_head.weight"
SOS_ROW, TASK_ID_ROW = 0, 1  # rows of llm_embedding

# Optional trace of every LM forward call: [new positions, cached positions before the call, total].
StepLog = list[list[int]]


def drop_tied_lm_head(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint state dict without the tied, unused ``lm_head`` (so ``load_state_dict(strict=True)`` works)."""
    return {k: v for k, v in state_dict.items() if k != TIED_LM_HEAD_KEY}


class TextSpeechLM(nn.Module):
    """Text + prompt -> speech token ids. Keys equal the reference ``Qwen2LM.state_dict()`` minus the lm_head."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.llm_embedding = Embedding(2, cfg.llm_input_size)
        self.llm = Qwen2Encoder(cfg.qwen)
        self.llm_decoder = nn.Linear(cfg.llm_output_size, cfg.num_speech_ids)
        self.speech_embedding = Embedding(cfg.num_speech_ids, cfg.llm_input_size)

    # ---- ids and small helpers -------------------------------------------------------------------------------
    @property
    def eos_id(self) -> int:
        return self.cfg.eos_id

    @property
    def fill_id(self) -> int:
        return self.cfg.fill_id

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end a (non-bistream) decode: eos, the unused id and fill."""
        return frozenset(range(self.cfg.speech_token_size, self.cfg.num_speech_ids))

    @property
    def device(self) -> torch.device:
        return self.llm_embedding.weight.device

    def new_cache(self, capacity: int = 0) -> KVCache:
        return self.llm.body.new_cache(capacity)

    def marker(self, row: int) -> torch.Tensor:
        """``[1, 1, H]`` embedding of sos (row 0) / task_id (row 1)."""
        return self.llm_embedding.weight[row].reshape(1, 1, -1)

    def empty_embeds(self) -> torch.Tensor:
        w = self.llm_embedding.weight
        return w.new_zeros(1, 0, w.shape[1])

    def embed_text(self, ids: torch.Tensor | None) -> torch.Tensor:
        """Text ids ``[1, n]`` (any int dtype, n may be 0 or None) -> ``[1, n, H]`` via Qwen's ``embed_tokens``."""
        if ids is None or ids.numel() == 0:
            return self.empty_embeds()
        return self.llm.embed_tokens(ids.to(self.device, torch.long))

    def embed_speech(self, ids: torch.Tensor | None) -> torch.Tensor:
        """Speech ids ``[1, n]`` -> ``[1, n, H]`` via ``speech_embedding``."""
        if ids is None or ids.numel() == 0:
            return self.empty_embeds()
        return self.speech_embedding(ids.to(self.device, torch.long))

    def speech_step_input(self, token: int) -> torch.Tensor:
        return self.speech_embedding.weight[token].reshape(1, 1, -1)

    # ---- teacher-forced pieces (parity tests, training) ------------------------------------------------------
    def build_input(
        self, text: torch.Tensor, prompt_text: torch.Tensor | None = None, prompt_speech: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[sos, embed_tokens(prompt_text ++ text), task_id, speech_embedding(prompt_speech)]`` -> ``[1, T, H]``.

        text ``[1, Tt]``, prompt_text ``[1, Tp]``, prompt_speech ``[1, Ps]`` (prompts may be None or empty:
        cross-lingual uses neither, instruct2 passes the instruction as prompt_text and no speech).
        """
        return torch.cat(
            [
                self.marker(SOS_ROW),
                self.embed_text(prompt_text),
                self.embed_text(text),
                self.marker(TASK_ID_ROW),
                self.embed_speech(prompt_speech),
            ],
            dim=1,
        )

    def forward_hidden(
        self, embeds: torch.Tensor, positions: torch.Tensor | None = None, cache: KVCache | list[KVCache] | None = None
    ) -> torch.Tensor:
        """embeds ``[B, T, H]`` -> last Qwen hidden state ``[B, T, H]`` (causal; positions 0.. unless given)."""
        return self.llm(embeds, positions, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[..., H]`` -> ``[..., speech_token_size + 3]``."""
        return self.llm_decoder(hidden)

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits(hidden).log_softmax(dim=-1)

    def next_log_probs(self, embeds: torch.Tensor, cache) -> torch.Tensor:
        """Append ``embeds [B, n, H]`` to ``cache`` (a KVCache, a list of them, or a pooled step); the log-probs of
        each row's next id, ``[B, V]``, on the CPU whatever the model's device: the samplers' generators are CPU ones
        (the same draws on every device) and the ids are needed on the host anyway (one copy per step)."""
        return self.log_probs(self.llm(embeds, cache=cache)[:, -1]).cpu()

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        """embeds ``[B, T, H]`` -> logits ``[B, T, speech_token_size + 3]``."""
        return self.logits(self.forward_hidden(embeds))

    def _step(self, embeds: torch.Tensor, cache: KVCache, step_log: StepLog | None) -> torch.Tensor:
        """Append ``embeds [1, n, H]`` to the cache; return log-probs of the next id, ``[V]``."""
        if step_log is not None:
            step_log.append([embeds.shape[1], cache.length, cache.length + embeds.shape[1]])
        return self.next_log_probs(embeds, cache)[0]

    # ---- decoding ---------------------------------------------------------------------------------------------
    def _drive(self, decoder: UnistreamDecoder | BistreamDecoder, step_log: StepLog | None) -> Iterator[int]:
        """Run ``decoder`` until it finishes or waits for text; yield the speech ids it emits."""
        while (embeds := decoder.next_input()) is not None:
            token = decoder.accept(self._step(embeds, decoder.cache, step_log))
            if token is not None:
                yield token

    @torch.inference_mode()
    def generate(
        self,
        text: torch.Tensor,
        prompt_text: torch.Tensor | None = None,
        prompt_speech: torch.Tensor | None = None,
        sampler: Sampler | None = None,
        min_len: int | None = None,
        max_len: int | None = None,
        generator: torch.Generator | None = None,
        step_log: StepLog | None = None,
    ) -> Iterator[int]:
        """Yield speech token ids one at a time (docs/design.md, "CosyVoice 2 LM sequence layouts").

        text ``[1, Tt]``, prompt_text ``[1, Tp]``, prompt_speech ``[1, Ps]`` (see ``build_input``). ``min_len`` /
        ``max_len`` default to ``min/max_token_text_ratio * Tt``; eos is masked (-inf) for the first ``min_len``
        steps and decoding stops at any of eos / unused / fill, or after ``max_len`` tokens. ``sampler`` defaults
        to RAS with ``generator`` (None = torch's global RNG).
        """
        text_len = text.shape[1]
        min_len = int(text_len * self.cfg.min_token_text_ratio) if min_len is None else min_len
        max_len = int(text_len * self.cfg.max_token_text_ratio) if max_len is None else max_len
        sampler = sampler if sampler is not None else RasSampler(self.cfg.sampling, generator)
        decoder = UnistreamDecoder(self, text, prompt_text, prompt_speech, sampler, min_len, max_len)
        try:
            yield from self._drive(decoder, step_log)
        finally:
            decoder.close()

    @torch.inference_mode()
    def generate_bistream(
        self,
        text_chunks: Iterable[torch.Tensor],
        prompt_text: torch.Tensor | None = None,
        prompt_speech: torch.Tensor | None = None,
        sampler: Sampler | None = None,
        generator: torch.Generator | None = None,
        max_len: int | None = None,
        reference_quirks: bool = True,
        step_log: StepLog | None = None,
    ) -> Iterator[int]:
        """Yield speech ids while text arrives in chunks ``[1, n]`` (mix ratio ``cfg.mix_ratio`` = N:M).

        Layout: docs/design.md, "CosyVoice 2 LM sequence layouts".

        Text and speech are interleaved as the model was trained: N text tokens, then M speech tokens, then a fill
        id (forced by position, never fed back) asking for the next N text tokens. See ``BistreamDecoder`` for the
        final phase, the length limit and ``reference_quirks``.
        """
        sampler = sampler if sampler is not None else RasSampler(self.cfg.sampling, generator)
        decoder = BistreamDecoder(self, prompt_text, prompt_speech, sampler, max_len=max_len,
                                  reference_quirks=reference_quirks)
        try:
            for chunk in text_chunks:
                decoder.feed_text(chunk)
                yield from self._drive(decoder, step_log)
            decoder.end_text()
            yield from self._drive(decoder, step_log)
        finally:
            decoder.close()
