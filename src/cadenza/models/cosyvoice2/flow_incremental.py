"""Incremental streaming flow: chunk k costs the same whatever k is (docs/design.md, "CosyVoice 2 streaming schedule").

The reference streams by re-running the whole flow over prompt + every token so far and keeping the new frames,
which is quadratic in the utterance length. With ``streaming=True`` every attention is chunk-causal (a query in
chunk c sees keys ``< (c+1) * chunk``), every convolution is causal and the CFM noise is fixed from frame 0, so
the frames of *complete* chunks never change once their tokens (and the ``pre_lookahead_len`` tokens after them)
are known. ``IncrementalFlow`` keeps, per request, the state those frames leave behind and computes only new
frames:

* encoder (``StreamCache`` in tokens, viewed x``ratio`` for the upsampled half): the look-ahead layer's input
  history, conformer keys/values and projected relative positions, the upsampler's causal tail;
* ``mu`` frames that are final but not yet committed by the estimator (when its chunk is not ``ratio`` x the
  encoder's);
* estimator: one ``StreamCache`` per Euler step, each holding both CFG rows: every causal conv's input tail and
  every transformer block's keys/values.

A push that ends inside a chunk commits only the complete chunks before it; the tokens of the partial chunk are
kept and recomputed with the next push. With the engine's schedule only the first chunk's partial chunk is (its first
hop is one chunk for any prompt, every later chunk ends on a chunk boundary); with the reference's hops nothing is.

Frames are returned only once their tokens' look-ahead is complete, as the reference's ``finalize=False`` call
returns no frames for its last ``pre_lookahead_len`` tokens: a non-final push whose look-ahead is short (the tokens
so far end before it) holds its last tokens back as look-ahead context only; a later push or the final one returns
their frames. Every sequence of pushes therefore returns ``ratio`` x (all tokens) frames in all, never a frame
computed with zeros in place of look-ahead tokens that then arrive.

At a speaking rate (``set_speed``, ``speed_method="flow"``) the estimator's frames are ``FrameRate`` positions in
``mu``: the committed ``mu`` frames a later frame still reads are kept (``_mu_tail`` from ``_mu_base``), a push
returns the frames whose ``mu`` is final or, at the end, all of them, and the counts above become
``FrameRate.total`` of the tokens' frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from cadenza.errors import InputError
from cadenza.layers.stream_cache import RowStreamCaches, StreamCache
from cadenza.models.cosyvoice2.cfm import time_grid
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.models.cosyvoice2.flow_rate import FrameRate


class _Plan(NamedTuple):
    """What a push encodes: ``ids`` produce frames; ``held`` (their look-ahead incomplete) and ``context`` follow
    them as look-ahead only (``held`` ++ ``context`` = the ``pre_lookahead_len`` tokens after ``ids``, or fewer at
    the end of the final push)."""

    ids: torch.Tensor  # [1, n] pending + new tokens whose look-ahead is complete (all of them on the final push)
    held: torch.Tensor  # [1, h] the tokens after ids: kept pending, their frames come with a later push
    context: torch.Tensor  # [1, <= pre_lookahead_len - h] look-ahead tokens after held
    final: bool


class _Step(NamedTuple):
    """One push's CFM inputs and the positions to commit once it ran (frames ``[f_start, f_end)``)."""

    ids: torch.Tensor  # [1, n] the encoded tokens (``_Plan.ids``)
    held: torch.Tensor  # [1, h] tokens after them, kept pending (``_Plan.held``)
    commit: int  # tokens whose encoder state is final after this push
    mu: torch.Tensor  # [1, mel, f_end - f_start]
    cond: torch.Tensor  # [1, mel, f_end - f_start]
    mask: torch.Tensor  # [1, 1, f_end - f_start]
    f_start: int
    f_end: int
    f_commit: int  # frames whose estimator state is final after this push
    final: bool
    source: torch.Tensor | None = None  # at a speaking rate: the mu frames read, [1, mel, n] from source_base
    source_base: int = 0


def _decode_batch(sessions: list[IncrementalFlow], steps: list[_Step]) -> torch.Tensor:
    """The CFM of several sessions' equal-length steps in one batch -> mel ``[n, mel, T]`` (``flow.decoder``'s
    ``forward``, with each session's own noise offset, speaker and per-step caches)."""
    cfm = sessions[0]._flow.decoder
    mu = torch.cat([s.mu for s in steps])
    # temperature 1 (as ``push``): the noise is used as is
    z = torch.cat([cfm.initial_noise(s.f_end, mu.device, mu.dtype, s.f_start) for s in steps])
    t_span = time_grid(cfm.n_timesteps, cfm.t_scheduler, mu.device, mu.dtype)
    caches = [RowStreamCaches([session._step_caches[k] for session in sessions]) for k in range(cfm.n_timesteps)]
    spks = torch.cat([session._spks for session in sessions])
    return cfm.solve_euler(z, t_span, mu, torch.cat([s.mask for s in steps]), spks, torch.cat([s.cond for s in steps]),
                           streaming=True, caches=caches)


class IncrementalFlow:
    """One streaming request's flow state: ``push`` token chunks, get their mel frames.

    Each non-final push returns the frames ``flow.inference(t_1 ++ .. ++ t_k ++ lookahead, streaming=True,
    finalize=False)`` has beyond the frames returned before (``lookahead`` = the next real tokens known so far, up
    to ``pre_lookahead_len``: that call gives no frames for the last ``pre_lookahead_len`` tokens of its input), and
    a ``final=True`` push the rest of ``flow.inference(all tokens, streaming=True, finalize=True)`` (float32
    round-off apart). All pushes together return ``ratio`` x the tokens pushed. Nothing is stored on ``flow``, so
    any number of sessions may share it (one at a time per thread).
    """

    def __init__(
        self,
        flow: TokenToMelFlow,
        prompt_token: torch.Tensor,
        prompt_feat: torch.Tensor,
        embedding: torch.Tensor,
        reserve_tokens: int = 0,
    ) -> None:
        """prompt_token ``[1, P]`` int; prompt_feat ``[1, ratio * P, mel]``; embedding ``[1, spk_embed_dim]``;
        reserve_tokens: expected number of tokens to push (sizes the key/value buffers once; they grow by doubling
        beyond it, which costs a copy and up to 2x memory)."""
        cfg = flow.cfg
        if not flow.decoder.estimator.supports_cache:
            raise InputError("incremental streaming needs the single-level (causal) estimator U-Net")
        flow.check_prompt(prompt_token, prompt_feat, embedding)
        if prompt_feat.size(1) != cfg.token_mel_ratio * prompt_token.size(1):
            raise InputError(
                f"prompt_feat has {prompt_feat.size(1)} frames; incremental streaming needs exactly "
                f"token_mel_ratio x prompt tokens = {cfg.token_mel_ratio * prompt_token.size(1)}"
            )
        weight = flow.spk_embed_affine_layer.weight
        self._flow = flow
        self._ratio = cfg.token_mel_ratio
        self._lookahead_len = cfg.pre_lookahead_len
        self._token_chunk = cfg.encoder.static_chunk_size
        self._frame_chunk = cfg.estimator.static_chunk_size
        with torch.inference_mode():
            self._spks = flow.speaker_projection(embedding.to(device=weight.device, dtype=weight.dtype))
        self._prompt_feat = prompt_feat.to(device=weight.device, dtype=weight.dtype)
        self._pending = prompt_token.to(device=weight.device, dtype=torch.long)  # tokens after the committed ones
        self._promised = self._pending.new_zeros(1, 0)  # look-ahead tokens the committed state relies on
        self._tokens_done = 0  # tokens whose encoder state is committed (a multiple of the token chunk)
        self._mu_tail = None  # final mu of frames [mu_base, ratio * tokens_done) still to be read by the estimator
        self._mu_base = 0  # first mu frame of _mu_tail (frames_done at speed 1)
        self._rate: FrameRate | None = None  # set_speed: the estimator's frames at a speaking rate
        self._prompt_tokens = prompt_token.size(1)
        self._frames_done = 0  # frames whose estimator state is committed (a multiple of the frame chunk)
        self._emitted = prompt_feat.size(1)  # frames returned so far (the prompt's are never returned)
        reserve = prompt_token.size(1) + max(0, reserve_tokens)
        self._encoder_cache = StreamCache(reserve=reserve)
        self._step_caches = [StreamCache(reserve=self._ratio * reserve) for _ in range(flow.decoder.n_timesteps)]
        self._finished = False
        self._closed = False

    @property
    def frames_emitted(self) -> int:
        """Mel frames returned so far (``ratio`` x the tokens pushed whose look-ahead was complete; all of them after
        the final push)."""
        return self._emitted - self._prompt_feat.size(1)

    def frames_to_compute(self, n_tokens: int, final: bool = False) -> int:
        """Estimator frames a push of ``n_tokens`` new tokens with a complete look-ahead (or a final one) runs (with
        the pending ones and the waiting ``mu``): ``push_many`` batches the sessions whose counts are equal."""
        return self._out_frames(self._ratio * (self._tokens_done + self._pending.size(1) + n_tokens), final) \
            - self._frames_done

    def _out_frames(self, mu_frames: int, final: bool) -> int:
        """Estimator frames computable from the first ``mu_frames`` frames of ``mu`` (all of them when ``final``)."""
        return mu_frames if self._rate is None else self._rate.frames(mu_frames, final)

    def set_speed(self, speed: float) -> None:
        """Render the tokens pushed from now on at ``speed`` (``flow_rate.FrameRate``: ``1 / speed`` as many frames;
        for a flow trained on speaking-rate pairs). Before the first push of tokens (a primed session may be set)."""
        if self._closed or self._finished or self._promised.size(1) or (
                self._tokens_done + self._pending.size(1) != self._prompt_tokens):
            raise InputError("set_speed() comes before the first push")
        self._rate = None if speed == 1.0 else FrameRate(speed, self._prompt_feat.size(1))
        self._mu_base = self._frames_done  # at speed 1 so far: _mu_tail starts at the estimator's frames

    @property
    def nbytes(self) -> int:
        """Bytes held by the caches (what ``close`` frees)."""
        return sum(c.nbytes for c in (self._encoder_cache, *self._step_caches)) + sum(
            t.numel() * t.element_size() for t in (self._pending, self._mu_tail) if t is not None
        )

    @torch.inference_mode()
    def prime(self) -> None:
        """Compute the prompt's state before any token arrives: the complete chunks of prompt tokens whose look-ahead
        lies inside the prompt depend on nothing else, so they are committed now (the rest of the prompt stays
        pending for the first push). Outputs of later pushes are unchanged; a primed session ``clone`` d per request
        saves every request of one voice that work."""
        if self._closed or self._tokens_done or self._emitted != self._prompt_feat.size(1) or self._finished:
            raise InputError("prime() comes before the first push, once")
        plan = self._plan(self._pending, self._pending.new_zeros(1, 0), False)
        if plan is not None:
            self._run(plan)  # no frames out: all are the prompt's

    def clone(self) -> IncrementalFlow:
        """An independent copy of this session's state (e.g. of a primed prompt, for a new request)."""
        if self._closed:
            raise InputError("this IncrementalFlow is closed")
        out = object.__new__(IncrementalFlow)
        out.__dict__.update(self.__dict__)
        out._encoder_cache = self._encoder_cache.clone()
        out._step_caches = [cache.clone() for cache in self._step_caches]
        return out  # the remaining tensors (pending, promised, mu_tail, spks, prompt) are replaced, never mutated

    @torch.inference_mode()
    def push(self, tokens: torch.Tensor, lookahead: torch.Tensor | None = None, final: bool = False) -> torch.Tensor:
        """tokens ``[1, n]`` int, lookahead ``[1, <= pre_lookahead_len]`` (the real next tokens; None or empty when
        none is known yet, and on the final push) -> mel ``[1, mel, F]`` float32: the frames of the tokens (pushed
        now or before) whose look-ahead is now complete and whose frames were not returned yet, ``F = ratio * n``
        when the look-ahead is complete every time; the final push returns all remaining frames (``n`` may be 0).

        A shorter look-ahead than announced before is completed with the announced tokens (they are known to come
        next); a look-ahead that contradicts earlier ones raises ``InputError``.
        """
        plan = self._accept(tokens, lookahead, final)
        return plan if isinstance(plan, torch.Tensor) else self._run(plan)

    def _run(self, plan: _Plan) -> torch.Tensor:
        """Encode ``plan.ids``, run the CFM over the new frames and commit: the new frames' mel (see ``_advance``)."""
        try:
            step = self._encode(plan)
            mel = self._flow.decoder(step.mu, step.mask, self._spks, step.cond, streaming=True,
                                     caches=self._step_caches, frame_offset=step.f_start)
            return self._advance(step, mel)
        except BaseException:
            self.close()  # the caches may be half-updated: the session cannot continue
            raise

    @staticmethod
    @torch.inference_mode()
    def push_many(
        sessions: Sequence[IncrementalFlow],
        tokens: Sequence[torch.Tensor],
        lookaheads: Sequence[torch.Tensor | None],
        finals: Sequence[bool],
    ) -> list[torch.Tensor]:
        """``push`` on several sessions of one flow at once: returns each session's mel ``[1, mel, ratio * n_i]``.

        The encoder runs per session; the CFM's estimator calls of sessions with equal frame counts run as one batch
        (rows ``[cond_1 .. cond_n, uncond_1 .. uncond_n]``, each attending over its own cached keys), which is what
        makes it cheaper than separate pushes. Results equal separate pushes up to float32 round-off of the batched
        matrix products. If any push fails, every session given is closed (their states may be half-updated).
        """
        n = len(sessions)
        if not (len(tokens) == len(lookaheads) == len(finals) == n):
            raise InputError(f"push_many needs one tokens/lookahead/final per session, got {len(tokens)}, "
                             f"{len(lookaheads)}, {len(finals)} for {n} sessions")
        if len({id(s) for s in sessions}) != n:
            raise InputError("push_many got the same session twice")
        if len({id(s._flow) for s in sessions}) > 1:
            raise InputError("push_many needs sessions of one flow")
        outs: list[torch.Tensor | None] = [None] * n
        try:
            steps: dict[int, _Step] = {}
            for i, session in enumerate(sessions):
                plan = session._accept(tokens[i], lookaheads[i], finals[i])
                if isinstance(plan, torch.Tensor):
                    outs[i] = plan
                else:
                    steps[i] = session._encode(plan)
            groups: dict[int, list[int]] = {}
            for i, step in steps.items():
                groups.setdefault(step.mu.size(2), []).append(i)
            for members in groups.values():
                if len(members) == 1:
                    i = members[0]
                    session, step = sessions[i], steps[i]
                    mel = session._flow.decoder(step.mu, step.mask, session._spks, step.cond, streaming=True,
                                                caches=session._step_caches, frame_offset=step.f_start)
                    outs[i] = session._advance(step, mel)
                    continue
                mel = _decode_batch([sessions[i] for i in members], [steps[i] for i in members])
                for row, i in enumerate(members):
                    outs[i] = sessions[i]._advance(steps[i], mel[row : row + 1])
        except BaseException:
            for session in sessions:
                session.close()
            raise
        return outs

    def _accept(self, tokens: torch.Tensor, lookahead: torch.Tensor | None, final: bool) -> _Plan | torch.Tensor:
        """Check a push and take its look-ahead: what to encode, or the (empty) output when there is nothing to
        compute."""
        if self._closed or self._finished:
            raise InputError("this IncrementalFlow is " + ("closed" if self._closed else "finished (final push done)"))
        device = self._pending.device
        tokens = self._check_tokens(tokens, "tokens").to(device)
        lookahead = self._pending.new_zeros(1, 0) if lookahead is None else self._check_tokens(lookahead, "lookahead")
        if final and lookahead.size(1):
            raise InputError("the final push takes no look-ahead tokens")
        if lookahead.size(1) > self._lookahead_len:
            raise InputError(f"at most {self._lookahead_len} look-ahead tokens, got {lookahead.size(1)}")
        if tokens.size(1) == 0 and not final:
            raise InputError("a non-final push needs at least one token")
        frames = self._out_frames(self._ratio * (self._tokens_done + self._pending.size(1) + tokens.size(1)), True)
        if frames > self._flow.decoder.rand_noise.size(2):
            raise InputError(f"the flow can generate at most {self._flow.decoder.rand_noise.size(2)} mel frames per "
                             f"utterance (prompt included), this push would reach {frames}")
        context = self._merge_lookahead(tokens, lookahead.to(device), final)
        plan = self._plan(torch.cat([self._pending, tokens], dim=1), context, final)
        if plan is None:
            # No token gained a complete look-ahead: nothing to compute, the tokens wait (all of them pending).
            self._pending = torch.cat([self._pending, tokens], dim=1)
            self._finished = final
            return self._prompt_feat.new_zeros(1, self._prompt_feat.size(2), 0).float()
        return plan

    def _plan(self, ids: torch.Tensor, context: torch.Tensor, final: bool) -> _Plan | None:
        """Split the pending + new tokens ``ids [1, n]`` (followed by the look-ahead ``context``) into those to encode
        and those held back; None when none is to encode."""
        # Without look-ahead tokens the encoder's look-ahead layer reads zeros: right only at the very end (the
        # final push), so on other pushes the last tokens lacking look-ahead produce no frames yet and act as
        # context, exactly as the reference's ``finalize=False`` call treats the last tokens of its input.
        held = 0 if final else min(ids.size(1), self._lookahead_len - context.size(1))
        n = ids.size(1) - held
        total = self._tokens_done + n
        new_frames = self._out_frames(self._ratio * total, final) > self._emitted
        new_chunks = total // self._token_chunk > self._tokens_done // self._token_chunk
        # At a speaking rate the final push may owe frames without owing tokens: the last frames read the last mu
        # frame, which earlier pushes had to keep back (``FrameRate.ready``).
        owed = final and self._rate is not None and new_frames
        if (n == 0 and not owed) or not (new_frames or (new_chunks and not final)):
            return None  # no frame out and no state worth keeping: running it would only repeat earlier work
        return _Plan(ids[:, :n], ids[:, n:], context, final)

    def _encode(self, plan: _Plan) -> _Step:
        """Encode the tokens ``plan.ids`` (pending + new ones); position the estimator caches on the frames after the
        committed ones and build the CFM inputs for them."""
        ids = plan.ids
        start, total = self._tokens_done, self._tokens_done + ids.size(1)
        # Every encoded token's look-ahead is complete (``_plan``); only complete chunks become final.
        commit = max(start, total // self._token_chunk * self._token_chunk)
        if ids.size(1):
            self._encoder_cache.at(start, commit - start)
            context = torch.cat([plan.held, plan.context], dim=1)
            mu = self._flow.encode_tokens(ids, context, streaming=True, cache=self._encoder_cache)
            if self._mu_tail is not None:
                mu = torch.cat([self._mu_tail, mu], dim=2)
        else:  # a final push at a speaking rate with frames owed and no token left: the kept mu is all it reads
            mu = self._mu_tail

        r = self._ratio
        if self._rate is not None:
            return self._encode_at_rate(plan, commit, mu)
        f_start, f_end = self._frames_done, r * total
        f_commit = max(f_start, r * commit // self._frame_chunk * self._frame_chunk)
        for cache in self._step_caches:
            cache.at(f_start, f_commit - f_start)
        cond = self._flow.prompt_condition(self._prompt_feat, f_start, f_end, mu)
        mask = torch.ones(1, 1, f_end - f_start, device=mu.device, dtype=mu.dtype)
        return _Step(ids, plan.held, commit, mu, cond, mask, f_start, f_end, f_commit, plan.final)

    def _encode_at_rate(self, plan: _Plan, commit: int, mu: torch.Tensor) -> _Step:
        """``_encode``'s CFM inputs at a speaking rate: ``mu`` (its frames ``[mu_base, ratio * total)``) resampled
        to the estimator frames computable now; those whose ``mu`` is all committed are committed, per chunk."""
        rate, r = self._rate, self._ratio
        base, end = self._mu_base, r * (self._tokens_done + plan.ids.size(1))
        f_start = self._frames_done
        f_end = max(f_start, self._out_frames(end, plan.final))
        f_commit = max(f_start, rate.ready(r * commit) // self._frame_chunk * self._frame_chunk)
        frames = rate.resample(mu, base, f_start, f_end, end)
        for cache in self._step_caches:
            cache.at(f_start, f_commit - f_start)
        cond = self._flow.prompt_condition(self._prompt_feat, f_start, f_end, frames)
        mask = torch.ones(1, 1, f_end - f_start, device=mu.device, dtype=mu.dtype)
        return _Step(plan.ids, plan.held, commit, frames, cond, mask, f_start, f_end, f_commit, plan.final, mu, base)

    def _advance(self, step: _Step, mel: torch.Tensor) -> torch.Tensor:
        """Commit the state after the CFM produced ``mel [1, mel, f_end - f_start]``; return the new frames."""
        r, start = self._ratio, self._tokens_done
        # The prompt's frames (and, after ``prime``, frames before the emitted ones) are never returned.
        out = mel[:, :, min(self._emitted, step.f_end) - step.f_start :].float()
        self._emitted = max(self._emitted, step.f_end)
        self._pending = torch.cat([step.ids[:, step.commit - start :], step.held], dim=1)
        self._tokens_done = step.commit
        if step.source is None:
            self._mu_tail = (step.mu[:, :, step.f_commit - step.f_start : r * step.commit - step.f_start]
                             if r * step.commit > step.f_commit else None)
        else:  # keep the committed mu frames that the next estimator frames read
            keep = max(step.source_base, min(self._rate.first_needed(step.f_commit), r * step.commit - 1))
            self._mu_tail = (step.source[:, :, keep - step.source_base : r * step.commit - step.source_base]
                             if r * step.commit > keep else None)
            self._mu_base = keep if self._mu_tail is not None else r * step.commit
        self._frames_done = step.f_commit
        self._finished = step.final
        return out

    def _merge_lookahead(self, tokens: torch.Tensor, lookahead: torch.Tensor, final: bool) -> torch.Tensor:
        """Check the new tokens against the look-ahead announced before; return this push's look-ahead context."""
        seq = torch.cat([tokens, lookahead], dim=1)
        promised = self._promised
        overlap = min(seq.size(1), promised.size(1))
        if not torch.equal(seq[:, :overlap], promised[:, :overlap]):
            raise InputError("the pushed tokens differ from the look-ahead tokens given before them")
        if final and promised.size(1) > tokens.size(1):
            raise InputError("the final push ends before the look-ahead tokens announced earlier")
        longer = seq if seq.size(1) >= promised.size(1) else promised
        self._promised = longer[:, tokens.size(1) :]
        return self._promised[:, : self._lookahead_len]

    def _check_tokens(self, ids: torch.Tensor, name: str) -> torch.Tensor:
        self._flow.check_tokens(ids, name)
        return ids.long()

    def close(self) -> None:
        """Free every cached tensor; the session cannot be used afterwards."""
        for cache in (self._encoder_cache, *self._step_caches):
            cache.free()
        self._pending = self._pending.new_zeros(1, 0)
        self._promised = self._pending
        self._mu_tail = None
        self._closed = True

    def __enter__(self) -> IncrementalFlow:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
