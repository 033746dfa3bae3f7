"""Retry on bad cases, non-streaming as the reference and — our addition — in streaming too.

See docs/design.md, "VoxCPM 2 stop rule and retry".

Reference rule: the generation loop is capped at ``min(int(n_text · ratio + 10), max_len)`` patches (always, retry
or not); an attempt is *bad* when it produced ``>= n_text · ratio`` patches (the model ran away instead of
stopping). Attempt ``k`` (0-based) draws its noise from a generator seeded ``seed + k``; a bad attempt is retried
up to ``max_attempts`` attempts in all, and the last attempt is used even if bad. ``RetryOutcome.seed`` is the seed
of the attempt used (the reference's ``last_successful_seed``).

Streaming (the reference disables retry there: audio already sent cannot be taken back). The criterion is exactly
decidable at one point only: once patch number ``ceil(n_text · ratio)`` exists, the attempt is bad whatever comes
next; before that nothing can be concluded. So holding back fewer patches than that buys nothing, and the policy
is binary per request:

* ``ceil(n_text · ratio) <= max_holdback_patches`` (short texts, where runaways are most frequent): the stream
  withholds its audio until the attempt either ends (then releases it, chunk by chunk) or turns bad (then restarts
  silently with the next seed). The final attempt streams without holdback. Output = the non-streaming retry
  output, decoded incrementally; the cost is first-chunk latency for these short texts only.
* otherwise audio flows immediately; if the attempt turns bad, it cannot be retried: generation stops there (the
  patch that made it bad is dropped) instead of running 10 more patches to the cap, a warning is logged and
  ``RetryOutcome.truncated`` is set.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from cadenza.errors import InputError
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.generate import GenerationOptions, GenerationResult, PatchStep, iter_patches
from cadenza.models.voxcpm2.layouts import SequenceLayout
from cadenza.models.voxcpm2.model import VoxCPM2Model
from cadenza.models.voxcpm2.streaming import PatchDecoder, decoder_context, decoder_context_patches, locked_steps

log = logging.getLogger(__name__)

Lock = AbstractContextManager | None  # e.g. a threading.RLock shared by the engine's requests
NoiseArg = torch.Generator | torch.Tensor | Sequence[torch.Tensor] | None
LENGTH_SLACK = 10  # patches the loop cap allows beyond n_text · ratio (reference constant)


@dataclass(frozen=True)
class RetryPolicy:
    """Reference defaults (``VoxCPM.generate``): on, 3 attempts, ratio 6. ``max_holdback_patches`` is ours."""

    enabled: bool = True
    max_attempts: int = 3
    ratio: float = 6.0  # retry_badcase_ratio_threshold: patches per target-text token
    max_holdback_patches: int = 12  # streaming: withhold audio to keep retry possible when the verdict comes this soon

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InputError(f"retry max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        if not (isinstance(self.ratio, (int, float)) and math.isfinite(self.ratio) and self.ratio > 0):
            raise InputError(f"retry ratio must be a positive number, got {self.ratio!r}")
        if self.max_holdback_patches < 0:
            raise InputError(f"max_holdback_patches must be >= 0, got {self.max_holdback_patches}")

    @property
    def attempts(self) -> int:
        return self.max_attempts if self.enabled else 1

    def loop_cap(self, target_len: int, max_len: int) -> int:
        """Patches the loop may generate: ``min(int(n_text · ratio + 10), max_len)`` (applied even when disabled)."""
        return max(1, min(int(target_len * self.ratio + LENGTH_SLACK), max_len))

    def is_bad(self, n_patches: int, target_len: int) -> bool:
        return n_patches >= target_len * self.ratio

    def bad_at(self, target_len: int) -> int:
        """The smallest patch count judged bad (the verdict is known as soon as that patch exists)."""
        return max(1, math.ceil(target_len * self.ratio))


@dataclass(frozen=True)
class Attempt:
    seed: int | None  # None: replayed noise
    n_patches: int
    stopped: bool  # ended by the stop head
    bad: bool


@dataclass
class RetryOutcome:
    """What happened to one request (filled in as generation runs)."""

    attempts: list[Attempt] = field(default_factory=list)
    seed: int | None = None  # seed of the attempt whose audio was returned
    truncated: bool = False  # streaming: a bad attempt was cut short because its audio was already out
    result: GenerationResult | None = None  # non-streaming: the chosen attempt


def attempt_noise(k: int, seed: int | None, noise: NoiseArg) -> tuple[NoiseArg, int | None]:
    """Noise of attempt ``k``: the replayed ``noise`` for the first attempt if given, else a generator seeded
    ``seed + k`` (equal to the reference's ``torch.manual_seed(seed + k)`` draws on CPU)."""
    if k == 0 and noise is not None:
        return noise, None
    if seed is None:
        raise InputError("a retry after replayed noise needs a seed for the next attempt")
    return torch.Generator().manual_seed(seed + k), seed + k


def collect(steps: list[PatchStep], layout: SequenceLayout, options: GenerationOptions) -> GenerationResult:
    """The steps of one finished attempt as a ``GenerationResult`` (same as ``generate_latents``)."""
    patches = torch.cat([s.patch for s in steps])
    return GenerationResult(
        patches=patches.float(),
        context=decoder_context_patches(layout, options, patches.dtype).to(patches.device),
        stop_logits=torch.cat([s.stop_logits for s in steps]).float(),
        stopped=steps[-1].stopped,
    )


def generate_with_retry(
    model: VoxCPM2Model,
    layout: SequenceLayout,
    target_len: int,
    options: GenerationOptions,
    policy: RetryPolicy,
    seed: int | None,
    noise: NoiseArg = None,
    lock: Lock = None,
    on_step: Callable[[PatchStep], None] | None = None,
) -> RetryOutcome:
    """Non-streaming generation with the reference's retry loop; ``options.max_len`` is the caller's hard cap."""
    opts = replace(options, max_len=policy.loop_cap(target_len, options.max_len))
    outcome = RetryOutcome()
    for k in range(policy.attempts):
        source, used_seed = attempt_noise(k, seed, noise)
        steps = []
        for step in locked_steps(iter_patches(model, layout, opts, source), lock):
            if on_step is not None:
                on_step(step)
            steps.append(step)
        bad = policy.is_bad(len(steps), target_len)
        outcome.attempts.append(Attempt(used_seed, len(steps), steps[-1].stopped, bad))
        outcome.seed, outcome.result = used_seed, collect(steps, layout, opts)
        if not (policy.enabled and bad):
            break
        if k + 1 < policy.attempts:
            log.info("bad case: %d patches for %d text tokens (ratio %.2f); retrying with seed %s",
                     len(steps), target_len, len(steps) / target_len, None if seed is None else seed + k + 1)
    return outcome


def stream_with_retry(
    model: VoxCPM2Model,
    vae: AudioVAE,
    layout: SequenceLayout,
    target_len: int,
    options: GenerationOptions,
    policy: RetryPolicy,
    seed: int | None,
    noise: NoiseArg = None,
    *,
    outcome: RetryOutcome | None = None,
    reference_onset: bool = False,
    lock: Lock = None,
) -> Iterator[np.ndarray]:
    """Streaming generation with retry (module docstring): yields one float32 chunk per released patch.

    ``outcome`` (optional) is filled in as the stream runs. Closing the iterator frees every per-request state.
    """
    outcome = outcome if outcome is not None else RetryOutcome()
    opts = replace(options, max_len=policy.loop_cap(target_len, options.max_len))
    bad_at = policy.bad_at(target_len)
    hold = policy.enabled and bad_at <= policy.max_holdback_patches
    decoder = PatchDecoder(vae, decoder_context(layout, opts, reference_onset, model.dtype), lock)
    try:
        for k in range(policy.attempts):
            final = k == policy.attempts - 1
            source, used_seed = attempt_noise(k, seed, noise)
            held: list[torch.Tensor] = []
            released = n = 0
            stopped = verdict_bad = False
            steps = locked_steps(iter_patches(model, layout, opts, source), lock)
            try:
                for step in steps:
                    n, stopped = step.index + 1, step.stopped
                    if policy.enabled and not final and n >= bad_at:
                        verdict_bad = True
                        break
                    if hold and not final and not step.is_last:
                        held.append(step.patch)
                        continue
                    for patch in (*held, step.patch):
                        released += 1
                        yield decoder.decode(patch)
                    held.clear()
            finally:
                steps.close()
            outcome.attempts.append(Attempt(used_seed, n, stopped, verdict_bad or policy.is_bad(n, target_len)))
            outcome.seed = used_seed
            if not verdict_bad:
                return
            if released:
                outcome.truncated = True
                log.warning("bad case while streaming: %d patches for %d text tokens and %d chunks already sent; "
                            "cannot retry, stopping here", n, target_len, released)
                return
            log.info("bad case before any audio was released (%d patches for %d text tokens); retrying with "
                     "seed %s", n, target_len, None if seed is None else seed + k + 1)
    finally:
        decoder.close()
