"""The public Python API: ``Cadenza.from_pretrained(path).synthesize(text, ...)`` for CosyVoice 2, ``VoxCPM2`` for
VoxCPM 2, and ``load(path)`` for either (a small class per family over loader -> model, frontend, engine, in the spirit
of F5-TTS's ``api.py``). ``VoxCPM2`` is imported on first use.
"""

from cadenza.api.arguments import check_chars, check_device, check_seed, check_text_arg
from cadenza.api.audio import Audio, PromptAudio
from cadenza.api.cosyvoice2 import Cadenza
from cadenza.api.loading import load, model_family
from cadenza.api.warm_up import warm_up

__all__ = ["Audio", "Cadenza", "PromptAudio", "VoxCPM2", "check_chars", "check_device", "check_seed",
           "check_text_arg", "load", "model_family", "warm_up"]


def __getattr__(name: str):
    if name == "VoxCPM2":
        from cadenza.api.voxcpm2 import VoxCPM2

        return VoxCPM2
    raise AttributeError(f"module 'cadenza.api' has no attribute {name!r}")
