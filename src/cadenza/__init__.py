"""Cadenza: streaming, zero-shot voice-cloning speech synthesis with language models.

``Cadenza``, ``Audio`` and ``load`` are imported on first use, so ``import cadenza.text`` (pure Python) does not pull
in torch.
"""

from cadenza.errors import (
    AudioError,
    CadenzaError,
    CheckpointError,
    EngineBusyError,
    InputError,
    TextError,
    UnknownSpeakerError,
)

__version__ = "0.1.0"
__all__ = ["Audio", "AudioError", "Cadenza", "CadenzaError", "CheckpointError", "EngineBusyError", "InputError",
           "SchedulerConfig", "TextError", "UnknownSpeakerError", "VoxCPM2", "load", "model_family", "__version__"]


def __getattr__(name: str):
    if name in ("Audio", "Cadenza", "load", "model_family"):
        from cadenza import api

        return getattr(api, name)
    if name == "SchedulerConfig":
        from cadenza.engine.scheduler_config import SchedulerConfig

        return SchedulerConfig
    if name == "VoxCPM2":
        from cadenza.api.voxcpm2 import VoxCPM2

        return VoxCPM2
    raise AttributeError(f"module 'cadenza' has no attribute {name!r}")
