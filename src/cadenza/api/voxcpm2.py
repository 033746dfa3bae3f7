"""The public Python API for VoxCPM 2 models, in the style of ``Cadenza`` (``cadenza.load`` picks the family).

::

    tts = cadenza.load("VoxCPM2")                                   # the released folder, unchanged
    tts.synthesize("(A warm, low voice)Hello there.").save("designed.wav")        # voice design
    tts.synthesize("Hello!", reference_wav="me.wav")                               # reference cloning
    tts.synthesize("Hello!", prompt_wav="me.wav", prompt_text="what I say")        # continuation cloning
    for chunk in tts.synthesize_stream("Hello!", reference_wav="me.wav"): ...      # 48 kHz chunks
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from cadenza.api.arguments import check_seed, check_text_arg
from cadenza.api.audio import Audio
from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.errors import InputError, TextError
from cadenza.models.voxcpm2.prompt import PromptAudio


class VoxCPM2:
    """A loaded VoxCPM 2 model. Thread-safe (see ``VoxCPM2Engine``)."""

    family = "voxcpm2"

    def __init__(self, engine: VoxCPM2Engine, directory: Path) -> None:
        self.engine = engine
        self.directory = directory

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str = "cpu", dtype: torch.dtype | str | None = None,
                        lora: str | os.PathLike | None = None) -> VoxCPM2:
        """``dtype`` None: float32 on CPU, the config's dtype (bf16) on GPU. ``lora``: a LoRA folder to apply."""
        directory = Path(path).expanduser()
        return cls(VoxCPM2Engine.from_pretrained(directory, device=device, dtype=dtype, lora=lora), directory)

    @property
    def sample_rate(self) -> int:
        return self.engine.sample_rate

    def request(self, text: str, *, reference_wav: PromptAudio | None = None, prompt_wav: PromptAudio | None = None,
                prompt_text: str | None = None, seed: int | None = None, normalize: bool = True, **options):
        """Modes: plain text; ``(description)text`` voice design; ``reference_wav`` cloning; ``prompt_wav`` +
        ``prompt_text`` continuation; reference + continuation combined. ``options``: ``cfg_value``,
        ``inference_timesteps``, ``retry``, ``retry_max_attempts``, ``min_len``, ``max_len``.

        Text arguments must be strings of valid Unicode without NUL, ``seed`` an integer in [0, 2**63) (``TextError``
        / ``InputError`` naming the argument, before any work)."""
        check_text_arg(text, "text")
        check_text_arg(prompt_text, "prompt_text", optional=True)
        check_seed(seed)
        return self.engine.build(text, reference_wav=reference_wav, prompt_wav=prompt_wav, prompt_text=prompt_text,
                                 seed=seed, normalize=normalize, **options)

    def synthesize(self, text: str, **kwargs) -> Audio:
        return Audio(self.engine.synthesize(self.request(text, **kwargs)), self.sample_rate)

    def synthesize_stream(self, text: str, **kwargs) -> Iterator[np.ndarray]:
        """48 kHz float32 chunks (one per generated patch) as soon as each is made."""
        if not isinstance(text, str):
            raise TextError("VoxCPM 2 streams audio, not text input: give the whole text as a string")
        return self.engine.stream(self.request(text, **kwargs))

    def design(self, description: str, text: str, **kwargs) -> Audio:
        """Voice design: a voice described in words (no audio)."""
        if any(kwargs.get(k) is not None for k in ("reference_wav", "prompt_wav")):
            raise InputError("voice design takes a description, not audio: use clone for reference audio")
        check_text_arg(description, "description")
        check_text_arg(text, "text")
        description = description.strip().strip("()")
        if not description:
            raise InputError("the voice description is empty")
        return self.synthesize(f"({description}){text}", **kwargs)

    def load_lora(self, path: str | os.PathLike) -> None:
        self.engine.load_lora(path)

    def set_lora_enabled(self, enabled: bool) -> None:
        self.engine.set_lora_enabled(enabled)

    def merge_lora(self) -> None:
        self.engine.merge_lora()

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> VoxCPM2:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
