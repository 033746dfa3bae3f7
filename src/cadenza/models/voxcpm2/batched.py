"""One patch step for many VoxCPM 2 requests at once: the step functions of the scheduler (continuous batching).

See docs/design.md, "VoxCPM 2 networks" and "VoxCPM 2 patch sampler"; docs/performance.md, "VoxCPM 2 batching".

``PatchRun`` is ``iter_patches`` (``generate.py``) as an object: one attempt of one request — its prefill, KV caches,
noise source and patch index — stepped from outside. For B runs:

* ``step_runs``: one DiT condition call; one flow sampler call per group of runs with the same
  ``(inference_timesteps, use_cfg_zero_star)`` (each row its own ``cfg_value``); one stop-head call; the stop rule
  per run;
* ``advance_runs``: one LocEnc call for the B patches and one decode step of both LMs over the runs' own caches
  (any lengths; ``lm.advance_many``).

Each run may carry its own LoRA adapter (``PatchRun.lora``, from ``lora_bank.LoRABank``): every batched call sets
the rows' adapters (``lora_rows``), so runs with different adapters, and without one, share the same calls.

``RequestSteps`` holds what one request carries between steps: its retry state machine (``retry.RetryRun``), the
running attempt, its streaming decoder and the released patches not decoded yet (``PatchDecoder.decode_many`` decodes
one of each of many requests in one AudioVAE call). The scheduler (``engine/voxcpm2_scheduler.py``) owns one per
request.

Noise stays per request: each run draws its own ``[1, D, P]`` per patch from its own source, in patch order
(``PatchRun.noise``, called by the caller so a failing draw fails that request alone), so batching never changes
which noise a request sees. With one run every call is the batch-1 call of ``iter_patches`` (the same numbers bit
for bit); with more, only the matrix products see more rows, which CPU GEMM kernels round differently (float32:
~1e-7 relative per product).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np
import torch

from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.generate import (
    GenerationOptions,
    NoiseSource,
    PatchStep,
    draw_noise,
    noise_source,
    patch_limit,
    stop_rule,
)
from cadenza.models.voxcpm2.layouts import SequenceLayout
from cadenza.models.voxcpm2.lm import LMState, advance_many, prefill
from cadenza.models.voxcpm2.lora_bank import BankedLoRA, lora_rows
from cadenza.models.voxcpm2.model import VoxCPM2Model
from cadenza.models.voxcpm2.request import VoxCPM2Request
from cadenza.models.voxcpm2.retry import RetryRun
from cadenza.models.voxcpm2.streaming import PatchDecoder, decode_result, decoder_context

NoiseArg = torch.Generator | torch.Tensor | Sequence[torch.Tensor] | None


class PatchRun:
    """One attempt of one request. Prefills at construction (batch 1); ``close`` frees the KV caches."""

    def __init__(self, model: VoxCPM2Model, layout: SequenceLayout, options: GenerationOptions,
                 noise: NoiseArg = None, lora: BankedLoRA | None = None) -> None:
        self.options = options
        self.max_len = patch_limit(model, layout, options)
        self.lora = lora  # this run's rows use it in every batched call (None: the model as it is)
        self._model = model
        self._draw: NoiseSource = noise_source(noise)
        with torch.inference_mode(), lora_rows([lora]):
            self.state: LMState | None = prefill(
                model, layout, capacity=min(model.config.max_length, len(layout) + self.max_len))
        self.index = 0  # of the next patch
        self.finished = False  # the last patch was made

    @property
    def group(self) -> tuple[int, bool]:
        """Runs with the same key share a sampler call."""
        return self.options.inference_timesteps, self.options.use_cfg_zero_star

    def noise(self) -> torch.Tensor:
        """The next patch's noise ``[1, D, P]`` (one draw from this request's source)."""
        return draw_noise(self._model, self._draw, self.index, self.options)

    def close(self) -> None:
        if self.state is not None:
            self.state.lm_cache.free()
            self.state.residual_cache.free()
            self.state = None


@torch.inference_mode()
def step_runs(model: VoxCPM2Model, runs: list[PatchRun], noise: list[torch.Tensor]) -> list[PatchStep]:
    """The next patch of every run (``noise[i]`` ``[1, D, P]`` from ``runs[i].noise()``): one ``PatchStep`` each,
    with ``is_last`` / ``stopped`` by the stop rule. The runs' caches are not touched (``advance_runs`` does)."""
    if any(r.state is None or r.finished for r in runs):
        raise ValueError("every run must be open and unfinished")
    states = [r.state for r in runs]
    lm_hidden = _rows([s.lm_hidden for s in states])  # [B, H]
    residual = _rows([s.residual_hidden for s in states])
    prev = _rows([s.prev_patch for s in states])  # [B, P, D]
    z = _rows(noise)  # [B, D, P]
    with lora_rows([r.lora for r in runs]):
        mu = model.dit_condition(lm_hidden, residual)  # [B, 2·Hd]
    groups: dict[tuple[int, bool], list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(run.group, []).append(i)
    if len(groups) == 1:
        patches = _sample(model, mu, prev, z, runs, list(range(len(runs))))
    else:
        patches = torch.empty_like(prev)
        for rows in groups.values():
            idx = torch.tensor(rows, device=mu.device)
            patches[idx] = _sample(model, mu[idx], prev[idx], z[idx], runs, rows)
    stop_logits = model.stop_logits(lm_hidden)  # [B, 2]
    steps = []
    for i, run in enumerate(runs):
        stopped, is_last = stop_rule(run.index, stop_logits[i], run.options, run.max_len)
        steps.append(PatchStep(run.index, patches[i : i + 1], stop_logits[i : i + 1], lm_hidden[i : i + 1],
                               residual[i : i + 1], is_last, stopped))
        run.index += 1
        run.finished = is_last
    return steps


def _rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Batch-1 tensors -> one batch (the tensor itself for one: batch 1 stays the exact ``iter_patches`` call)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def _sample(model: VoxCPM2Model, mu: torch.Tensor, prev: torch.Tensor, z: torch.Tensor, runs: list[PatchRun],
            rows: list[int]) -> torch.Tensor:
    """``VoxCPM2Model.sample_patch`` for the runs ``rows`` (one group: same timesteps and CFG-Zero*), each row with
    its own cfg value. mu ``[b, 2·Hd]``, prev ``[b, P, D]``, z ``[b, D, P]`` -> ``[b, P, D]``."""
    options = runs[rows[0]].options
    cfg = [runs[i].options.cfg_value for i in rows]
    with lora_rows([runs[i].lora for i in rows]):
        out = model.feat_decoder(mu, prev.transpose(1, 2), z, n_timesteps=options.inference_timesteps,
                                 cfg_value=cfg[0] if len(cfg) == 1 else cfg,
                                 use_cfg_zero_star=options.use_cfg_zero_star)
    return out.transpose(1, 2)


@torch.inference_mode()
def advance_runs(model: VoxCPM2Model, runs: list[PatchRun], patches: list[torch.Tensor]) -> None:
    """Feed ``patches[i]`` ``[1, P, D]`` (the step just made) to ``runs[i]``: the LMs move one position."""
    if not runs:
        return
    patch = _rows(patches)  # [B, P, D]
    with lora_rows([r.lora for r in runs]):
        emb = model.embed_patches(patch[:, None])[:, 0]  # [B, H]
        advance_many(model, [r.state for r in runs], patch, emb)


class RequestSteps:
    """One request between batched steps (``stream``: released patches are decoded one by one, else the whole
    utterance at the end). Touched by one thread at a time; ``close`` frees the caches and the decoder state."""

    def __init__(self, model: VoxCPM2Model, vae: AudioVAE, request: VoxCPM2Request, stream: bool) -> None:
        self.model, self.vae, self.request, self.stream = model, vae, request, stream
        self.retry = RetryRun(request.layout, request.target_len, request.options, request.retry, request.seed,
                              request.noise, stream=stream)
        self.run: PatchRun | None = None  # the running attempt
        self.decoder: PatchDecoder | None = None  # streaming
        self.pending: collections.deque[torch.Tensor] = collections.deque()  # released patches [1, P, D]

    @property
    def generating(self) -> bool:
        return not self.retry.done

    def next_noise(self) -> torch.Tensor:
        """The next patch's noise ``[1, D, P]``, after starting an attempt if none runs (prefill; a stream's decoder
        is warmed on the prompt tail at the first, as ``stream_with_retry`` does)."""
        if self.run is None:
            layout, options = self.request.layout, self.retry.options
            source = self.retry.start_attempt()
            if self.stream and self.decoder is None:
                context = decoder_context(layout, options, self.request.reference_onset, self.model.dtype)
                self.decoder = PatchDecoder(self.vae, context)
            self.run = PatchRun(self.model, layout, options, source, self.request.lora)
        return self.run.noise()

    def take(self, step: PatchStep) -> bool:
        """Hand the attempt's new patch to the retry state machine; True when the attempt goes on (advance it)."""
        verdict = self.retry.feed(step)
        self.pending.extend(verdict.release)
        if verdict.attempt_over:
            self.run.close()
            self.run = None
        return not verdict.attempt_over

    def whole(self) -> np.ndarray:
        """The finished (non-streaming) request's waveform, as ``VoxCPM2Engine.synthesize`` returns it."""
        return decode_result(self.vae, self.retry.outcome.result)

    def close(self) -> None:
        if self.run is not None:
            self.run.close()
            self.run = None
        if self.decoder is not None:
            self.decoder.close()
            self.decoder = None
        self.pending.clear()


def decode_pending(requests: list[RequestSteps]) -> list[np.ndarray]:
    """The oldest released patch of each streaming request, decoded in one AudioVAE call -> one chunk each."""
    return PatchDecoder.decode_many([r.decoder for r in requests], [r.pending.popleft() for r in requests])
