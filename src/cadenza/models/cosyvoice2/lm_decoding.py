"""Step-wise speech-token decoders for the CosyVoice 2 LM: one object per request, driven by whoever runs the LM.

A decoder owns the request's KV cache, history and position in the sequence layout; it never calls the network
itself. The driver asks ``next_input()`` for the embeddings to append (``None`` = nothing to do now: finished, or
waiting for more text), runs the LM on them, and hands the log-probabilities of the last position to ``accept()``,
which returns the speech token to emit (or ``None`` for fill / eos). ``TextSpeechLM.generate*`` drive one decoder
in a loop; the engine's scheduler drives many at once and batches their single-token steps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from cadenza.errors import CadenzaError

log = logging.getLogger(__name__)

# (logp [V], history of generated ids) -> next id. Samplers may modify logp in place, not the history.
Sampler = Callable[[torch.Tensor, Sequence[int]], int]
NEG_INF = float("-inf")


class UnistreamDecoder:
    """Whole text known up front: ``[sos, prompt_text ++ text, task_id, prompt_speech]`` then speech
    (docs/design.md, "CosyVoice 2 LM sequence layouts").

    eos is masked (-inf) for the first ``min_len`` steps; decoding stops at eos or after ``max_len`` tokens (a
    sampled fill or unused id is drawn again without them: see ``accept``).
    """

    def __init__(self, lm, text: torch.Tensor, prompt_text: torch.Tensor | None, prompt_speech: torch.Tensor | None,
                 sampler: Sampler, min_len: int, max_len: int, cache=None) -> None:
        """cache: where the keys and values go (default: a new ``KVCache`` of the LM; the scheduler may give a
        pooled one, ``layers/kv_pool.py``)."""
        self.lm, self.sampler = lm, sampler
        self.min_len, self.max_len = min_len, max_len
        self._pending: torch.Tensor | None = lm.build_input(text, prompt_text, prompt_speech)
        self.cache = cache if cache is not None else lm.new_cache(capacity=self._pending.shape[1] + min_len)
        self.out: list[int] = []
        self.finished = max_len <= 0

    def next_input(self) -> torch.Tensor | None:
        return None if self.finished else self._pending

    def accept(self, logp: torch.Tensor) -> int | None:
        if len(self.out) < self.min_len:
            logp[self.lm.eos_id] = NEG_INF
        token = int(self.sampler(logp, self.out))
        if token != self.lm.eos_id and token in self.lm.stop_ids:
            # fill asks for more text (bistream's turn marker) and the unused id means nothing; the whole text is
            # here already. The reference stops on them, which cuts the sentence short: a model trained on
            # bistream sequences too samples fill now and then (the built-in one said only "Hello." for "Hello,
            # world!" with half the seeds, stopping near the 15-token bistream turn). Not reproduced: draw again
            # without them. Only a draw that would have ended the reference's decode changes, so every complete
            # reference output is still matched token for token.
            for stop in self.lm.stop_ids - {self.lm.eos_id}:
                logp[stop] = NEG_INF
            token = int(self.sampler(logp, self.out))
        if token in self.lm.stop_ids:
            self.finished = True
            return None
        self.out.append(token)
        self._pending = self.lm.speech_step_input(token)
        self.finished = len(self.out) >= self.max_len
        return token

    def close(self) -> None:
        self.cache.free()
        self._pending = None
        self.finished = True


class BistreamDecoder:
    """Text arrives in pieces: N text tokens, then M speech tokens, then a forced fill asking for more.

    Layout: docs/design.md, "CosyVoice 2 LM sequence layouts".

    Prompt speech is interleaved with the first text the same way. ``feed_text`` appends text ids, ``end_text``
    starts the final phase (leftover text + task_id, decode until eos or ``max_len_ratio`` x received text tokens;
    the reference has no limit there). Differences from the reference generator, both matching the training
    layout: text that is already waiting when a fill comes is used at once (the reference waits for the next
    text piece), and whole N-token groups are still interleaved after the text ends (the reference feeds all
    leftover text in the final phase); with text fed one token at a time, as the reference frontend does, the
    two agree exactly. ``reference_quirks=True`` keeps the reference's final-phase input, which feeds the last
    speech embedding a second time (it is already in the KV cache); ``False`` is the correct layout.
    """

    def __init__(self, lm, prompt_text: torch.Tensor | None, prompt_speech: torch.Tensor | None, sampler: Sampler,
                 max_len_ratio: float | None = None, max_len: int | None = None, reference_quirks: bool = True,
                 capacity: int | None = None, cache=None) -> None:
        self.lm, self.sampler = lm, sampler
        self.n_text, self.n_speech = lm.cfg.mix_ratio
        self.max_len_ratio = lm.cfg.max_token_text_ratio if max_len_ratio is None else max_len_ratio
        self.fixed_max_len = max_len
        self.capacity = capacity  # hard cap on speech tokens (e.g. what the flow's noise buffer can hold)
        self.reference_quirks = reference_quirks
        self.cache = cache if cache is not None else lm.new_cache()  # (see UnistreamDecoder)
        self.out: list[int] = []  # every id produced, fills included (they are part of the RAS history)
        self.n_received = 0
        self.text_done = False
        self.final_phase = False
        self.finished = False
        self._lm_input = lm.marker(0)  # sos; grows with the interleaved prompt
        self._text = lm.embed_text(prompt_text)
        self._prompt = lm.embed_speech(prompt_speech)
        n_prompt = self._prompt.shape[1]
        self._next_fill = (n_prompt // self.n_speech + 1) * self.n_speech - n_prompt
        self._waiting = True  # no decoding until the prompt is placed and N text tokens are there

    @property
    def n_speech_tokens(self) -> int:
        return sum(1 for t in self.out if t < self.lm.cfg.speech_token_size)

    @property
    def max_len(self) -> int:
        n = self.fixed_max_len if self.fixed_max_len is not None else int(self.n_received * self.max_len_ratio)
        return n if self.capacity is None else min(n, self.capacity)

    def feed_text(self, ids: torch.Tensor) -> None:
        if self.text_done:
            raise CadenzaError("text fed after end_text()")
        self.n_received += ids.shape[1]
        self._text = torch.cat([self._text, self.lm.embed_text(ids)], dim=1)
        self._advance()

    def end_text(self) -> None:
        self.text_done = True
        self._advance()

    def _advance(self) -> None:
        """When waiting, take the next N text tokens (or start the final phase) if possible."""
        if not self._waiting or self.finished:
            return
        n = self.n_text
        while self._prompt.shape[1] > 0 and self._text.shape[1] >= n:
            self._lm_input = torch.cat([self._lm_input, self._text[:, :n], self._prompt[:, : self.n_speech]], dim=1)
            self._text, self._prompt = self._text[:, n:], self._prompt[:, self.n_speech :]
        after_fill = bool(self.out) and self.out[-1] == self.lm.fill_id
        if self._prompt.shape[1] == 0 and (after_fill or (not self.out and self._lm_input.shape[1] == 1)):
            if self._text.shape[1] >= n:
                # After a fill, the pending input is the last speech embedding, already cached: replace it.
                head = self._text[:, :n]
                self._lm_input = head if after_fill else torch.cat([self._lm_input, head], dim=1)
                self._text = self._text[:, n:]
                self._waiting = False
                return
        elif self._prompt.shape[1] == 0:
            self._waiting = False  # the interleaved prompt itself is the first input
            return
        if self.text_done:
            self._start_final_phase()

    def _start_final_phase(self) -> None:
        if self._prompt.shape[1] > 0:
            # Reference behaviour kept for parity: prompt speech that never got N text tokens to pair with is
            # dropped (the prompt's voice then conditions the LM only partially).
            log.warning("bistream: %d prompt speech tokens dropped (too little text)", self._prompt.shape[1])
        if self.out and self.out[-1] == self.lm.fill_id and not self.reference_quirks:
            self._lm_input = self.lm.empty_embeds()
        self._lm_input = torch.cat([self._lm_input, self._text, self.lm.marker(1)], dim=1)
        self._text = self.lm.empty_embeds()
        self.final_phase, self._waiting = True, False
        if self.n_speech_tokens >= self.max_len:
            self.finished = True

    def next_input(self) -> torch.Tensor | None:
        return None if self.finished or self._waiting else self._lm_input

    def _sample(self, logp: torch.Tensor, allowed: int) -> int:
        """Sample; should that give a special id other than ``allowed`` (eos in the final phase, fill before it),
        sample again with those ids masked. The reference raises there ("should not get token"), failing a valid
        request mid-stream on a rare draw; the first draw is unchanged, so parity holds wherever the reference
        does not fail."""
        size = self.lm.cfg.speech_token_size
        raw = logp.clone()  # the sampler may change logp in place
        token = int(self.sampler(logp, self.out))
        if token >= size and token != allowed:
            log.debug("bistream: special id %d drawn where only %d may come: drawn again without it", token, allowed)
            kept = raw[allowed].clone()
            raw[size:] = NEG_INF
            raw[allowed] = kept
            token = int(self.sampler(raw, self.out))
        return token

    def accept(self, logp: torch.Tensor) -> int | None:
        fill, eos, size = self.lm.fill_id, self.lm.eos_id, self.lm.cfg.speech_token_size
        if self.final_phase:
            token = self._sample(logp, allowed=eos)
            self.out.append(token)
            if token == eos:
                self.finished = True
                return None
            if token >= size:
                raise CadenzaError(f"bistream LM produced special id {token} in its final phase")
            if self.n_speech_tokens >= self.max_len:
                log.warning("bistream: stopped at max_len=%d speech tokens without eos", self.max_len)
                self.finished = True
        else:
            if len(self.out) == self._next_fill:
                token = fill
            else:
                logp[eos] = NEG_INF
                token = self._sample(logp, allowed=fill)
            if token == fill:  # forced or sampled: the next fill is due M speech tokens later
                self._next_fill = len(self.out) + self.n_speech + 1
            self.out.append(token)
            if token == fill:
                self._waiting = True
                self._advance()
                return None
            if token >= size:
                raise CadenzaError(f"bistream LM produced special id {token} while text was still arriving")
        self._lm_input = self.lm.speech_step_input(token)
        return token

    def close(self) -> None:
        self.cache.free()
        self.finished = True
