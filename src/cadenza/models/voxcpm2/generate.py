"""Autoregressive patch generation: prefill, then one latent patch per step.

See docs/design.md, "VoxCPM 2 networks", "VoxCPM 2 patch sampler" and "VoxCPM 2 stop rule and retry".

``iter_patches`` is the step function: a generator yielding one ``PatchStep`` per patch, usable as is by a
streaming front end (decode each yielded patch with the stateful AudioVAE decoder). ``generate_latents`` drains it
and returns everything a non-streaming caller needs to decode in one call.

Stop rule: the stop head looks at the same TSLM state that produced the patch; generation ends after patch ``i``
when ``i > min_len`` and its argmax is 1 (the stopping patch is kept), or after ``max_len`` patches.
Randomness: one noise draw ``[1, D, P]`` per patch, immediately before that patch's sampling, from an explicit
source (a private ``torch.Generator`` or replayed tensors); no global RNG is read or reseeded. A generator seeded
with ``s`` reproduces the reference's ``torch.manual_seed(s)`` run on CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from cadenza.errors import InputError, TextError
from cadenza.models.voxcpm2.layouts import SequenceLayout, patches_to_latents
from cadenza.models.voxcpm2.lm import advance, prefill
from cadenza.models.voxcpm2.model import VoxCPM2Model

log = logging.getLogger(__name__)

# (patch index, shape [1, D, P], dtype) -> noise tensor; see ``noise_source``.
NoiseSource = Callable[[int, tuple[int, ...], torch.dtype], torch.Tensor]


@dataclass(frozen=True)
class GenerationOptions:
    """Per-request sampling settings (reference defaults of the model-level API)."""

    min_len: int = 2  # stop flags at patch indices <= min_len are ignored
    max_len: int = 2000  # hard cap on generated patches
    inference_timesteps: int = 10
    cfg_value: float = 2.0
    temperature: float = 1.0
    context_patches: int = 3  # prompt-tail patches prepended for the decoder (streaming_prefix_len - 1)
    use_cfg_zero_star: bool = True  # False is reference-only (not reachable from its public API)

    def __post_init__(self) -> None:
        if self.min_len < 0 or self.max_len < 1:
            raise InputError(f"need min_len >= 0 and max_len >= 1, got {self.min_len}, {self.max_len}")
        if self.inference_timesteps < 1:
            raise InputError(f"inference_timesteps must be >= 1, got {self.inference_timesteps}")
        if self.temperature < 0 or self.context_patches < 0:
            raise InputError("temperature and context_patches must be >= 0")


def length_cap(target_text_tokens: int, max_len: int, ratio: float = 6.0) -> int:
    """Patches allowed for a target text of ``target_text_tokens`` ids: ``min(int(n·ratio + 10), max_len)``."""
    return min(int(target_text_tokens * ratio + 10), max_len)


def noise_source(noise: torch.Generator | torch.Tensor | Sequence[torch.Tensor] | None) -> NoiseSource:
    """Normalise a noise argument.

    * ``torch.Generator``: ``torch.randn(shape, dtype, generator=g)`` on the generator's device (a CPU generator
      therefore gives the same audio on every device);
    * a tensor ``[N, 1, D, P]`` or a sequence of ``[1, D, P]`` tensors: replayed in order (error when exhausted);
    * None: a private generator with a fresh random seed.
    """
    if noise is None:
        gen = torch.Generator()
        gen.seed()
        noise = gen
    if isinstance(noise, torch.Generator):
        gen = noise

        def draw(i: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.randn(shape, generator=gen, dtype=dtype, device=gen.device)

        return draw
    replay = list(noise)

    def take(i: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if i >= len(replay):
            raise InputError(f"replayed noise has {len(replay)} draws, patch {i} needs one more")
        t = replay[i]
        if tuple(t.shape) != tuple(shape):
            raise InputError(f"replayed noise {i} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        return t

    return take


@dataclass
class PatchStep:
    """One generated patch and the states that produced it (all batch 1)."""

    index: int
    patch: torch.Tensor  # [1, P, D]
    stop_logits: torch.Tensor  # [1, 2]
    lm_hidden: torch.Tensor  # [1, H] TSLM state used for this patch (and its stop decision)
    residual_hidden: torch.Tensor  # [1, H] RALM state used for this patch
    is_last: bool  # generation ends with this patch
    stopped: bool  # ... because the stop head said so (False: max_len reached or not last)


def patch_limit(model: VoxCPM2Model, layout: SequenceLayout, options: GenerationOptions) -> int:
    """Patches an attempt may generate: ``options.max_len``, fewer where the KV cache would overflow."""
    capacity = model.config.max_length
    if len(layout) >= capacity:
        raise TextError(f"the prompt sequence has {len(layout)} positions; the model holds at most {capacity - 1}")
    # Patch i needs the prompt plus i generated positions in the caches. The reference crashes with "KV cache is
    # full" past the capacity; we stop there instead (a warning says so).
    max_len = min(options.max_len, capacity - len(layout) + 1)
    if max_len < options.max_len:
        log.warning("max_len %d reduced to %d: the KV cache holds %d positions", options.max_len, max_len, capacity)
    return max_len


def draw_noise(model: VoxCPM2Model, draw: NoiseSource, i: int, options: GenerationOptions) -> torch.Tensor:
    """The noise of patch ``i``: one ``[1, D, P]`` draw in the model's dtype and device, times the temperature."""
    shape = (1, model.feat_dim, model.patch_size)
    return draw(i, shape, model.dtype).to(device=model.device, dtype=model.dtype) * options.temperature


def stop_rule(i: int, stop_logits: torch.Tensor, options: GenerationOptions, max_len: int) -> tuple[bool, bool]:
    """(stopped, is_last) after patch ``i`` with stop logits ``[2]`` (module docstring)."""
    stopped = i > options.min_len and int(stop_logits.argmax()) == 1
    return stopped, stopped or i == max_len - 1


@torch.inference_mode()
def iter_patches(
    model: VoxCPM2Model,
    layout: SequenceLayout,
    options: GenerationOptions | None = None,
    noise: torch.Generator | torch.Tensor | Sequence[torch.Tensor] | None = None,
) -> Iterator[PatchStep]:
    """Yield the generated patches one by one (see the module docstring for the rules)."""
    options = options or GenerationOptions()
    max_len = patch_limit(model, layout, options)
    draw = noise_source(noise)
    state = prefill(model, layout, capacity=min(model.config.max_length, len(layout) + max_len))
    for i in range(max_len):
        mu = model.dit_condition(state.lm_hidden, state.residual_hidden)
        z = draw_noise(model, draw, i, options)
        patch = model.sample_patch(
            mu, state.prev_patch, z, options.inference_timesteps, options.cfg_value, options.use_cfg_zero_star
        )
        stop_logits = model.stop_logits(state.lm_hidden)
        stopped, is_last = stop_rule(i, stop_logits[0], options, max_len)
        # Yield before embedding the patch: a streaming consumer can decode it while nothing else is pending.
        # (The reference also embeds the last patch, uselessly; we skip that.)
        yield PatchStep(i, patch, stop_logits, state.lm_hidden, state.residual_hidden, is_last, stopped)
        if is_last:
            return
        advance(model, state, patch, model.embed_patches(patch[:, None])[:, 0])


@dataclass
class GenerationResult:
    """Output of ``generate_latents``.

    ``latents`` ``[1, D, (c + N)·P]`` float32 = context patches then generated patches, ready for the AudioVAE
    decoder; drop the first ``context_len`` patches' worth of samples from the decoded audio.
    """

    patches: torch.Tensor  # [N, P, D] generated (no context)
    context: torch.Tensor  # [c, P, D] prompt-tail patches (continuation modes) else [0, P, D]
    stop_logits: torch.Tensor  # [N, 2]
    stopped: bool  # ended by the stop head (False: max_len reached)

    @property
    def context_len(self) -> int:
        return self.context.size(0)

    @property
    def latents(self) -> torch.Tensor:
        return patches_to_latents(torch.cat([self.context, self.patches]).to(torch.float32))


def generate_latents(
    model: VoxCPM2Model,
    layout: SequenceLayout,
    options: GenerationOptions | None = None,
    noise: torch.Generator | torch.Tensor | Sequence[torch.Tensor] | None = None,
    on_step: Callable[[PatchStep], None] | None = None,
) -> GenerationResult:
    """Run ``iter_patches`` to the end (``on_step`` sees every step, e.g. for progress or inspection)."""
    options = options or GenerationOptions()
    steps = []
    for step in iter_patches(model, layout, options, noise):
        if on_step is not None:
            on_step(step)
        steps.append(step)
    patches = torch.cat([s.patch for s in steps]).float()
    # The reference takes the context from its runtime-dtype copy of the prompt: round it the same way (bf16 parity)
    context = layout.context_patches(options.context_patches).to(patches.device, model.dtype).float()
    return GenerationResult(
        patches=patches,
        context=context,
        stop_logits=torch.cat([s.stop_logits for s in steps]).float(),
        stopped=steps[-1].stopped,
    )
