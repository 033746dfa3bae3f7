"""Cadenza: streaming, zero-shot voice-cloning speech synthesis with language models."""

from cadenza.api import Audio, Cadenza, load
from cadenza.errors import AudioError, CadenzaError, CheckpointError, InputError, TextError, UnknownSpeakerError

__version__ = "0.1.0"
__all__ = ["Audio", "AudioError", "Cadenza", "CadenzaError", "CheckpointError", "InputError", "TextError",
           "UnknownSpeakerError", "load", "__version__"]
