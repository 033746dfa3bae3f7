"""Runs VoxCPM 2 requests: text (+ voice audio) -> 48 kHz speech, whole or streamed.

::

    engine = VoxCPM2Engine.from_pretrained("VoxCPM2")           # the released folder, unchanged
    req = engine.build("(A warm, low voice)Hello there.", seed=1)  # voice design
    audio = engine.synthesize(req)                                # float32 [n] at engine.sample_rate (48000)
    for chunk in engine.stream(engine.build("Hi!", reference_wav="me.wav")):
        ...                                                       # 7680-sample chunks (160 ms) as they are made

Modes (from the arguments): plain text; voice design (text starting with ``(description)``); reference cloning
(``reference_wav``); continuation (``prompt_wav`` + its transcript ``prompt_text``); combined (both). A description
with reference audio is the reference's "controllable cloning"; a description with a continuation prompt is refused
(as the reference CLI refuses ``--control`` with a prompt transcript).

Concurrency: ``synthesize`` and ``stream`` go through ``engine.scheduler`` (``engine/voxcpm2_scheduler.py``), which
batches every active request: one patch step for all of them at a time (one DiT sampling call per group of equal
``inference_timesteps``, one stop-head call, one LM step over per-request KV caches, one AudioVAE decoder call), so
concurrent requests share the weight reads and the cores (docs/performance.md, "VoxCPM 2 batching": 2.6-2.9x the throughput of one request at a time at 8
concurrent streams on 2 cores). Each request keeps its own noise generator, retry state and decoder, so its audio is
what it would be alone, up to float rounding. ``engine.scheduler.submit`` gives a ``StreamHandle`` as the CosyVoice 2
engine's scheduler does; the limits are the ``SchedulerConfig`` given as ``scheduler=``. The engine may be shared by
threads. Model-wide LoRA changes (``load_lora``, ``merge_lora``, ...) wait for the running step and hold the next ones;
make them while no request runs (a request in flight would otherwise mix adapters). Per-request adapters
(``register_lora`` then ``build(..., lora=name)``) leave the weights alone and are applied to each request's own rows
of the batched steps, so requests with different adapters run together (docs/voxcpm2.md, "Serving several LoRA
adapters").
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.engine.voxcpm2_scheduler import VoxCPM2Scheduler
from cadenza.errors import InputError, TextError
from cadenza.models.voxcpm2 import lora as lora_ops
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.audio_vae_loader import load_audio_vae
from cadenza.models.voxcpm2.generate import GenerationOptions, GenerationResult
from cadenza.models.voxcpm2.layouts import VoicePrompt, make_layout
from cadenza.models.voxcpm2.loader import load_voxcpm2
from cadenza.models.voxcpm2.lora_bank import BankedLoRA, LoRABank
from cadenza.models.voxcpm2.model import VoxCPM2Model
from cadenza.models.voxcpm2.prompt import PromptAudio, build_voice_prompt
from cadenza.models.voxcpm2.request import VoxCPM2Request
from cadenza.models.voxcpm2.request_text import prepare_prompt_text, prepare_text
from cadenza.models.voxcpm2.retry import RetryOutcome, RetryPolicy
from cadenza.models.voxcpm2.streaming import decode_result
from cadenza.models.voxcpm2.tokenizer import VoxCPM2Tokenizer

log = logging.getLogger(__name__)

CFG_RANGE = (0.1, 10.0)  # reference CLI limits
TIMESTEPS_RANGE = (1, 100)
DEFAULT_MAX_LEN = 4096  # patches; the reference's VoxCPM.generate default


def _check_range(name: str, value, lo, hi, integer: bool = False) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not (lo <= value <= hi) or (not integer and not math.isfinite(value)):
        raise InputError(f"{name} must be {'an integer' if integer else 'a number'} in [{lo}, {hi}], got {value!r}")


class VoxCPM2Engine:
    """Model + AudioVAE + tokenizer. Stateless between requests (see the module docstring)."""

    def __init__(self, model: VoxCPM2Model, vae: AudioVAE, tokenizer: VoxCPM2Tokenizer,
                 directory: Path | None = None, scheduler: SchedulerConfig | None = None) -> None:
        self.model = model.eval()
        self.vae = vae.eval()
        self.tokenizer = tokenizer
        self.directory = directory
        self.config = model.config
        self.lock = threading.RLock()  # serialises LoRA changes (and prompt encoding) between callers
        self.scheduler = VoxCPM2Scheduler(self.model, self.vae, scheduler)  # its workers start with the 1st request
        self.loras = LoRABank(self.model)  # named adapters chosen per request (build(lora=...))

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu",
                        dtype: torch.dtype | str | None = None, lora: str | Path | None = None,
                        scheduler: SchedulerConfig | None = None) -> VoxCPM2Engine:
        """Load a VoxCPM 2 model directory (``config.json``, ``model.safetensors``, ``audiovae.pth``/``.safetensors``,
        ``tokenizer.json``).

        ``dtype``: None = float32 on CPU (the reference keeps the config's bf16 there: slower and less accurate on
        most CPUs) and the config's dtype (bf16 in the release) on accelerators; ``"bf16"``/``"fp16"``/``"fp32"`` or a
        torch dtype to choose. The AudioVAE always runs in float32. ``lora``: a LoRA checkpoint folder to apply.
        ``scheduler``: the request scheduler's limits and workers (default ``SchedulerConfig()``).
        """
        loaded = load_voxcpm2(directory, device=device, dtype=dtype)
        vae = load_audio_vae(loaded.files.directory, device=device)  # reads audio_vae_config of config.json
        engine = cls(loaded.model, vae, loaded.tokenizer, loaded.files.directory, scheduler)
        if lora is not None:
            engine.load_lora(lora)
        return engine

    @property
    def sample_rate(self) -> int:
        """Output rate of every waveform (48000 for the release)."""
        return self.vae.out_sample_rate

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    # -- requests ------------------------------------------------------------------------------------------------
    def voice(self, *, reference_wav: PromptAudio | None = None, prompt_wav: PromptAudio | None = None,
              prompt_text: str | None = None) -> VoicePrompt | None:
        """Encode voice audio once for reuse in many ``build(..., voice=...)`` calls (the reference's prompt cache).
        None when no audio is given."""
        if prompt_text is not None:
            prompt_text = prepare_prompt_text(prompt_text)
        with self.lock:
            return build_voice_prompt(self.vae, self.config.patch_size, reference_wav, prompt_wav, prompt_text)

    def build(
        self,
        text: str,
        *,
        reference_wav: PromptAudio | None = None,
        prompt_wav: PromptAudio | None = None,
        prompt_text: str | None = None,
        voice: VoicePrompt | None = None,
        seed: int | None = None,
        cfg_value: float = 2.0,
        inference_timesteps: int = 10,
        retry: bool = True,
        normalize: bool = False,
        min_len: int = 2,
        max_len: int = DEFAULT_MAX_LEN,
        retry_max_attempts: int = 3,
        retry_ratio: float = 6.0,
        stream_holdback: int = RetryPolicy.max_holdback_patches,
        reference_stream_onset: bool = False,
        noise: torch.Tensor | Sequence[torch.Tensor] | None = None,
        lora: str | None = None,
    ) -> VoxCPM2Request:
        """Validate the arguments, encode voice audio and tokenize: a request ready for ``synthesize``/``stream``.

        ``voice``: a prompt from ``engine.voice(...)`` instead of the audio arguments. ``seed``: None draws a fresh
        one (kept in ``request.seed``). ``retry``: the reference's bad-case retry (``retry_max_attempts`` attempts,
        bad = at least ``retry_ratio`` patches per target-text token); for streams, ``stream_holdback`` bounds the
        patches withheld to keep retry possible (see ``models/voxcpm2/retry.py``). ``reference_stream_onset``:
        start continuation streams from a cold decoder like the reference (default: warmed on the prompt tail, so
        streams equal ``synthesize``). ``noise``: replay these ``[N, 1, D, P]`` draws in the first attempt (tests).
        ``lora``: the name of a registered adapter (``register_lora``) for this request alone.
        Raises ``TextError`` / ``AudioError`` / ``InputError`` / ``UnknownLoRAError`` with the reason.
        """
        adapter = None if lora is None else self.loras.get(lora)
        _check_range("cfg_value", cfg_value, *CFG_RANGE)
        _check_range("inference_timesteps", inference_timesteps, *TIMESTEPS_RANGE, integer=True)
        if seed is None:
            seed = secrets.randbits(32)  # the reference's seeds are 32-bit too
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InputError(f"seed must be a non-negative integer, got {seed!r}")
        prepared = prepare_text(text, normalize)
        if voice is not None and (reference_wav is not None or prompt_wav is not None or prompt_text is not None):
            raise InputError("give either voice= (a prepared voice) or reference_wav / prompt_wav / prompt_text")
        if voice is None:
            voice = self.voice(reference_wav=reference_wav, prompt_wav=prompt_wav, prompt_text=prompt_text)
        if prepared.is_voice_design and voice is not None and voice.prompt_patches is not None:
            raise InputError(
                f"a voice description ({prepared.description!r}) cannot be combined with a continuation prompt "
                "(prompt_wav + prompt_text): the continued recording already fixes the voice. Use the description "
                "alone (voice design), or with reference_wav (controllable cloning)")
        options = GenerationOptions(min_len=min_len, max_len=max_len, inference_timesteps=inference_timesteps,
                                    cfg_value=float(cfg_value))
        policy = RetryPolicy(enabled=retry, max_attempts=retry_max_attempts, ratio=retry_ratio,
                             max_holdback_patches=stream_holdback)
        layout, target_len = make_layout(self.tokenizer, self.config, prepared.text, voice)
        capacity = self.config.max_length
        if len(layout) + min_len + 1 >= capacity:
            raise TextError(f"the text and voice prompt take {len(layout)} of the model's {capacity} positions, "
                            "leaving no room for speech: split the text or use a shorter prompt")
        return VoxCPM2Request(text=prepared, voice=voice, layout=layout, target_len=target_len, options=options,
                              retry=policy, seed=seed, reference_onset=reference_stream_onset, noise=noise,
                              lora=adapter)

    # -- running them --------------------------------------------------------------------------------------------
    def synthesize(self, request: VoxCPM2Request) -> np.ndarray:
        """The whole utterance: float32 ``[n]`` at ``sample_rate`` (``request.outcome`` tells what happened).
        Runs batched with the other requests in flight; raises ``EngineBusyError`` when the scheduler is full."""
        chunks = list(self.scheduler.submit(request, stream=False))
        return chunks[0]

    def stream(self, request: VoxCPM2Request) -> Iterator[np.ndarray]:
        """Float32 chunks of ``patch_size · 1920`` samples, one per generated patch, as soon as each is ready.
        The request is submitted on the first ``next``; closing the iterator (or dropping it) stops generation and
        frees the request's state."""
        request.outcome = RetryOutcome()
        return self._stream(request)

    def _stream(self, request: VoxCPM2Request) -> Iterator[np.ndarray]:
        handle = self.scheduler.submit(request, stream=True)
        try:
            yield from handle  # cancels the request when this closes early
        finally:
            self.scheduler.wait_freed(handle)  # closed = freed, as before batching (at most one step later)

    def decode(self, result: GenerationResult) -> np.ndarray:
        """Latents (+ continuation context) -> waveform, context audio cut off.

        See docs/design.md, "VoxCPM 2 prompt audio and decoding".
        """
        return decode_result(self.vae, result)

    # -- LoRA ----------------------------------------------------------------------------------------------------
    def load_lora(self, path: str | Path, config: lora_ops.LoRAConfig | None = None) -> lora_ops.LoRAConfig:
        """Apply a LoRA checkpoint folder (``lora_config.json`` + ``lora_weights.safetensors``); strict keys."""
        with self.lock, self.scheduler.exclusive():
            return lora_ops.load_lora(self.model, path, config)

    def set_lora_enabled(self, enabled: bool) -> None:
        with self.lock, self.scheduler.exclusive():
            lora_ops.set_lora_enabled(self.model, enabled)

    def merge_lora(self) -> None:
        """Fold the adapters into the weights (faster; ``unmerge_lora`` undoes it up to rounding)."""
        with self.lock, self.scheduler.exclusive():
            lora_ops.merge_lora(self.model)

    def unmerge_lora(self) -> None:
        with self.lock, self.scheduler.exclusive():
            lora_ops.unmerge_lora(self.model)

    def remove_lora(self) -> None:
        """Back to the base model (adapters unmerged and removed)."""
        with self.lock, self.scheduler.exclusive():
            lora_ops.remove_lora(self.model)

    def register_lora(self, name: str, path: str | Path) -> BankedLoRA:
        """Register a LoRA checkpoint folder as ``name``: requests built with ``lora=name`` use it, each on its own
        rows of the batched steps (the weights are not changed; other requests are not affected)."""
        with self.lock, self.scheduler.exclusive():
            return self.loras.add_folder(name, path)

    def register_lora_tensors(self, name: str, config: lora_ops.LoRAConfig, state: dict[str, torch.Tensor],
                              source: str = "LoRA weights") -> BankedLoRA:
        """``register_lora`` from a config and tensors already in memory (an upload)."""
        with self.lock, self.scheduler.exclusive():
            return self.loras.add(name, config, state, source)

    def unregister_lora(self, name: str) -> None:
        """Remove adapter ``name``; ``LoRAInUseError`` while queued or running requests use it."""
        with self.lock, self.scheduler.exclusive():
            adapter = self.loras.get(name)
            self.scheduler.retire_lora(adapter)
            self.loras.remove(name)

    def close(self) -> None:
        """Stop the scheduler: requests in flight end with ``RequestCancelledError``."""
        self.scheduler.close()
