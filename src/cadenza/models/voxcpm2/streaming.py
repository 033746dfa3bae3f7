"""Streaming synthesis: every generated patch is decoded once, as it comes, into a 48 kHz chunk.

See docs/design.md, "VoxCPM 2 streaming".

``PatchDecoder`` owns one request's stateful ``StreamingAudioVAEDecoder`` (the shared AudioVAE is never modified):
each ``decode(patch)`` returns ``P · decode_hop`` float32 samples (7680 = 160 ms for the release) that continue the
previous chunk exactly as one-shot decoding of all patches would.

**Continuation onset (deliberate fix).** Non-streaming decoding of continuation modes prepends the last
``context_patches`` (3) prompt patches and drops their audio, so the causal decoder starts from the prompt's tail.
The reference's streaming decoder starts from silence instead, so its streamed continuation audio differs from its
own non-streaming output (fixture: max |diff| 0.61 in the tiny model). We warm the streaming decoder with the same
prompt tail (decoded, audio discarded) before the first generated patch, so streamed chunks concatenate to the
non-streaming waveform (up to float rounding) in every mode. ``reference_onset=True`` restores the reference's cold
start (kept for parity tests with ``stream_continuation.safetensors``). For zero-shot and reference-only modes there
is no context and both settings are identical.

Thread-safety: pass a ``lock`` to serialise model use with other requests; it is held for one unit of work (one
patch, one decode) and never across a ``yield``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.audio_vae_streaming import StreamingAudioVAEDecoder
from cadenza.models.voxcpm2.generate import GenerationOptions, GenerationResult, PatchStep, iter_patches
from cadenza.models.voxcpm2.layouts import SequenceLayout, patches_to_latents
from cadenza.models.voxcpm2.model import VoxCPM2Model

Lock = contextlib.AbstractContextManager | None  # e.g. the engine's threading.RLock
NoiseArg = torch.Generator | torch.Tensor | Sequence[torch.Tensor] | None


def guarded(lock: Lock) -> contextlib.AbstractContextManager:
    return lock if lock is not None else contextlib.nullcontext()


def locked_steps(steps: Iterator[PatchStep], lock: Lock) -> Iterator[PatchStep]:
    """Advance ``steps`` under ``lock`` (one patch of model work per acquisition); closing this closes ``steps``."""
    try:
        while True:
            with guarded(lock):
                step = next(steps, None)
            if step is None:
                return
            yield step
    finally:
        steps.close()


class PatchDecoder:
    """One request's patch -> waveform decoder (AudioVAE always in float32).

    Args:
        vae: the shared AudioVAE (not modified).
        context: prompt-tail patches ``[c, P, D]`` to warm the decoder with (their audio is discarded), or None.
        lock: serialises the decoder calls with other users of the model (optional).
    """

    def __init__(self, vae: AudioVAE, context: torch.Tensor | None = None,
                 lock: Lock = None) -> None:
        self._vae = vae
        self._lock = lock
        self._decoder = StreamingAudioVAEDecoder(vae)
        self.warmup_frames = 0
        if context is not None and context.shape[0] > 0:
            self.warmup_frames = context.shape[0] * context.shape[1]
            with guarded(lock), torch.inference_mode():
                self._decoder.decode_chunk(patches_to_latents(context.float()))

    @property
    def closed(self) -> bool:
        return self._decoder.closed

    def decode(self, patches: torch.Tensor) -> np.ndarray:
        """patches ``[k, P, D]`` (a step's ``[1, P, D]`` patch; any float dtype) -> float32 ``[k · P · decode_hop]``
        at the VAE's output rate, continuing the previous call."""
        with guarded(self._lock), torch.inference_mode():
            wav = self._decoder.decode_chunk(patches_to_latents(patches.reshape(-1, *patches.shape[-2:]).float()))
        return wav.reshape(-1).cpu().numpy().astype(np.float32, copy=False)

    @staticmethod
    def decode_many(decoders: list[PatchDecoder], patches: list[torch.Tensor]) -> list[np.ndarray]:
        """One patch ``[1, P, D]`` for each decoder, decoded in one AudioVAE call (row i continues ``decoders[i]``)
        -> each one's float32 chunk ``[P · decode_hop]``, equal to ``decoders[i].decode(patches[i])`` up to float
        rounding. The decoders' locks are not taken (the caller serialises)."""
        if len(decoders) == 1:
            return [decoders[0].decode(patches[0])]
        latents = torch.cat([patches_to_latents(p.reshape(-1, *p.shape[-2:]).float()) for p in patches])
        with torch.inference_mode():
            wav = StreamingAudioVAEDecoder.decode_many([d._decoder for d in decoders], latents)
        return [w.reshape(-1).cpu().numpy().astype(np.float32, copy=False) for w in wav]

    def close(self) -> None:
        self._decoder.close()

    def __enter__(self) -> PatchDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def decode_result(vae: AudioVAE, result: GenerationResult) -> np.ndarray:
    """A finished generation's latents (+ continuation context) -> float32 waveform ``[n]``, context audio cut off
    (docs/design.md, "VoxCPM 2 prompt audio and decoding")."""
    with torch.inference_mode():
        wav = vae.decode(result.latents)
    skip = result.context_len * result.patches.shape[1] * vae.decode_hop_length
    return wav[0, 0, skip:].float().cpu().numpy()


def decoder_context_patches(layout: SequenceLayout, options: GenerationOptions, dtype: torch.dtype) -> torch.Tensor:
    """The prompt-tail patches ``[c, P, D]`` float32 that precede generated audio (``c = 0`` unless the layout ends
    with audio), rounded through the model ``dtype`` as the reference (it reads them from its runtime-dtype copy)."""
    return layout.context_patches(options.context_patches).to(dtype).float()


def decoder_context(layout: SequenceLayout, options: GenerationOptions, reference_onset: bool,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """The warm-up patches for a stream (None with ``reference_onset`` or when the layout ends with text)."""
    if reference_onset:
        return None
    context = decoder_context_patches(layout, options, dtype)
    return context if context.shape[0] else None


def stream_waveform(
    model: VoxCPM2Model,
    vae: AudioVAE,
    layout: SequenceLayout,
    options: GenerationOptions | None = None,
    noise: NoiseArg = None,
    *,
    reference_onset: bool = False,
    lock: Lock = None,
    steps_out: list[PatchStep] | None = None,
) -> Iterator[np.ndarray]:
    """Generate and decode patch by patch: yields one float32 chunk ``[P · decode_hop]`` per patch.

    ``noise`` as in ``generate.noise_source``; ``steps_out`` (optional) collects every ``PatchStep``.
    Closing the iterator stops generation and frees the KV caches and the decoder state.
    """
    options = options or GenerationOptions()
    decoder = PatchDecoder(vae, decoder_context(layout, options, reference_onset, model.dtype), lock)
    steps = locked_steps(iter_patches(model, layout, options, noise), lock)
    try:
        for step in steps:
            if steps_out is not None:
                steps_out.append(step)
            yield decoder.decode(step.patch)
    finally:
        steps.close()
        decoder.close()
