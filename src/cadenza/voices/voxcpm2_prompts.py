"""Saved voices as VoxCPM 2 prompts (``VoicePrompt``: AudioVAE latent patches of the recording, + its transcript).

A VoxCPM 2 voice clones in one of three ways, chosen when it is made (``cloning``):

* ``"reference"``: the recording is a reference the model copies the voice of (no transcript needed);
* ``"continuation"``: the model continues the recording (its transcript is required): closest to the recording's
  delivery, but a voice description cannot be combined with it;
* ``"combined"``: both (the default when a transcript is given): the reference's highest-similarity mode.
"""

from __future__ import annotations

import numpy as np
import torch

from cadenza.errors import InputError
from cadenza.models.voxcpm2.layouts import VoicePrompt
from cadenza.voices.cache_key import prompt_cache_key
from cadenza.voices.prompts import PromptLibrary
from cadenza.voices.records import VoiceRecord

CLONING_MODES = ("reference", "continuation", "combined")


class VoxCPM2Prompts(PromptLibrary):
    """``tts``: a ``cadenza.api.VoxCPM2``."""

    family = "voxcpm2"
    cloning_modes = CLONING_MODES

    def _model_key(self) -> str:
        directory = self.tts.directory
        files = [directory / "config.json", directory / "audiovae.safetensors", directory / "audiovae.pth"]
        return prompt_cache_key(files, family="vx2")

    def check_cloning(self, transcript: str | None, cloning: str | None) -> str:
        if cloning is None:
            return "combined" if transcript is not None else "reference"
        if cloning not in CLONING_MODES:
            raise InputError(f"cloning must be one of {', '.join(CLONING_MODES)}, not {str(cloning)[:40]!r}")
        if cloning != "reference" and transcript is None:
            raise InputError(f"cloning {cloning!r} continues the recording and needs its transcript: add "
                             "'transcript', or use cloning 'reference'")
        return cloning

    def _compute(self, samples: np.ndarray, sample_rate: int, transcript: str | None,
                 cloning: str | None) -> VoicePrompt:
        audio = (samples, sample_rate)
        cloning = cloning or ("combined" if transcript is not None else "reference")
        continued = cloning in ("continuation", "combined")
        return self.tts.engine.voice(reference_wav=audio if cloning in ("reference", "combined") else None,
                                     prompt_wav=audio if continued else None,
                                     prompt_text=transcript if continued else None)

    def _to_entry(self, prompt: VoicePrompt) -> dict:
        entry = {}
        if prompt.ref_patches is not None:
            entry["ref_patches"] = prompt.ref_patches
        if prompt.prompt_patches is not None:
            entry["prompt_patches"] = prompt.prompt_patches
            entry["prompt_text"] = torch.tensor(list(prompt.prompt_text.encode("utf-8")), dtype=torch.uint8)
        return entry

    def _from_entry(self, label: str, entry: dict) -> VoicePrompt:
        text = entry.get("prompt_text")
        return VoicePrompt(ref_patches=entry.get("ref_patches"),
                           prompt_text=None if text is None else bytes(text.tolist()).decode("utf-8"),
                           prompt_patches=entry.get("prompt_patches"))

    def _mode(self, record: VoiceRecord) -> str:
        return record.cloning or ("combined" if record.transcript is not None else "reference")
