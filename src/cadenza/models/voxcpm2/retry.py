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

Both policies live in one per-request state machine, ``RetryRun``: ``generate_with_retry`` and ``stream_with_retry``
drive it with ``iter_patches``, the VoxCPM 2 scheduler (``engine/voxcpm2_scheduler.py``) drives one per request
with batched steps, so both paths make the same decisions.
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
    return _result([s.patch for s in steps], [s.stop_logits for s in steps], steps[-1].stopped, layout, options)


def _result(patches: list[torch.Tensor], stop_logits: list[torch.Tensor], stopped: bool, layout: SequenceLayout,
            options: GenerationOptions) -> GenerationResult:
    joined = torch.cat(patches)
    return GenerationResult(
        patches=joined.float(),
        context=decoder_context_patches(layout, options, joined.dtype).to(joined.device),
        stop_logits=torch.cat(stop_logits).float(),
        stopped=stopped,
    )


@dataclass
class Verdict:
    """What ``RetryRun.feed`` says about one generated patch."""

    release: list[torch.Tensor]  # streaming: patches [1, P, D] whose audio may go out now, in order
    attempt_over: bool  # this attempt generates no more patches (free its caches)
    done: bool  # the request is finished and ``outcome`` complete (else the next attempt starts)


class RetryRun:
    """The retry policy of one request as a state machine (module docstring), stepped from outside.

    ``start_attempt()`` gives the noise source of the next attempt (generator seeded ``seed + k``); the caller runs
    that attempt (``iter_patches``, or a scheduler's batched steps) and passes each ``PatchStep`` to ``feed``, which
    says which patches may be released, whether the attempt is over and whether the request is done. ``stream``:
    the streaming policy (holdback, stop at the verdict); otherwise the reference's (attempts run to the loop cap,
    ``outcome.result`` holds the chosen one). ``options`` carries the loop cap (``max_len``) every attempt runs with.
    """

    def __init__(self, layout: SequenceLayout, target_len: int, options: GenerationOptions, policy: RetryPolicy,
                 seed: int | None, noise: NoiseArg = None, *, stream: bool, outcome: RetryOutcome | None = None
                 ) -> None:
        self.layout, self.target_len, self.policy, self.seed, self.noise = layout, target_len, policy, seed, noise
        self.stream = stream
        self.options = replace(options, max_len=policy.loop_cap(target_len, options.max_len))
        self.outcome = outcome if outcome is not None else RetryOutcome()
        self.bad_at = policy.bad_at(target_len)
        self.hold = policy.enabled and self.bad_at <= policy.max_holdback_patches  # streaming
        self.attempt = -1  # index of the attempt running (or last run)
        self.done = False
        self.released = 0  # streaming: patches released, all attempts
        self._seed: int | None = None  # of the running attempt
        self._patches: list[torch.Tensor] = []  # held (streaming) or all (non-streaming) patches of this attempt
        self._stop_logits: list[torch.Tensor] = []

    @property
    def final(self) -> bool:
        """The running attempt is the last one allowed."""
        return self.attempt >= self.policy.attempts - 1

    def start_attempt(self) -> NoiseArg:
        """Begin the next attempt; returns its noise (for ``iter_patches`` or ``noise_source``)."""
        if self.done:
            raise RuntimeError("this request is finished")
        self.attempt += 1
        source, self._seed = attempt_noise(self.attempt, self.seed, self.noise)
        self._patches, self._stop_logits = [], []
        return source

    def feed(self, step: PatchStep) -> Verdict:
        """Take the next patch of the running attempt."""
        verdict = self._feed_stream(step) if self.stream else self._feed_whole(step)
        self.done = verdict.done
        return verdict

    def _feed_whole(self, step: PatchStep) -> Verdict:
        self._patches.append(step.patch)
        self._stop_logits.append(step.stop_logits)
        if not step.is_last:
            return Verdict([], False, False)
        n = len(self._patches)
        bad = self.policy.is_bad(n, self.target_len)
        self.outcome.attempts.append(Attempt(self._seed, n, step.stopped, bad))
        self.outcome.seed = self._seed
        self.outcome.result = _result(self._patches, self._stop_logits, step.stopped, self.layout, self.options)
        done = not (self.policy.enabled and bad) or self.final
        if not done:
            log.info("bad case: %d patches for %d text tokens (ratio %.2f); retrying with seed %s", n,
                     self.target_len, n / self.target_len, self._next_seed())
        return Verdict([], True, done)

    def _feed_stream(self, step: PatchStep) -> Verdict:
        n = step.index + 1
        if self.policy.enabled and not self.final and n >= self.bad_at:  # the verdict: bad, whatever comes next
            self.outcome.attempts.append(Attempt(self._seed, n, step.stopped, True))
            self.outcome.seed = self._seed
            self._patches.clear()
            if self.released:
                self.outcome.truncated = True
                log.warning("bad case while streaming: %d patches for %d text tokens and %d chunks already sent; "
                            "cannot retry, stopping here", n, self.target_len, self.released)
                return Verdict([], True, True)
            log.info("bad case before any audio was released (%d patches for %d text tokens); retrying with "
                     "seed %s", n, self.target_len, self._next_seed())
            return Verdict([], True, False)
        if self.hold and not self.final and not step.is_last:
            self._patches.append(step.patch)
            return Verdict([], False, False)
        release, self._patches = [*self._patches, step.patch], []
        self.released += len(release)
        if step.is_last:
            self.outcome.attempts.append(Attempt(self._seed, n, step.stopped,
                                                 self.policy.is_bad(n, self.target_len)))
            self.outcome.seed = self._seed
        return Verdict(release, step.is_last, step.is_last)

    def _next_seed(self) -> int | None:
        return None if self.seed is None else self.seed + self.attempt + 1


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
    run = RetryRun(layout, target_len, options, policy, seed, noise, stream=False)
    while not run.done:
        for step in locked_steps(iter_patches(model, layout, run.options, run.start_attempt()), lock):
            if on_step is not None:
                on_step(step)
            run.feed(step)  # the attempt ends with the iterator (its last step)
    return run.outcome


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
    run = RetryRun(layout, target_len, options, policy, seed, noise, stream=True, outcome=outcome)
    decoder = PatchDecoder(vae, decoder_context(layout, run.options, reference_onset, model.dtype), lock)
    try:
        while not run.done:
            steps = locked_steps(iter_patches(model, layout, run.options, run.start_attempt()), lock)
            try:
                for step in steps:
                    verdict = run.feed(step)
                    for patch in verdict.release:
                        yield decoder.decode(patch)
                    if verdict.attempt_over:
                        break
            finally:
                steps.close()
    finally:
        decoder.close()
