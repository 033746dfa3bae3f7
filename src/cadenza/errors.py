"""Errors raised by Cadenza. Every user-facing failure is one of these, with a message that says what to fix."""


class CadenzaError(Exception):
    """Base class of all Cadenza errors."""


class CheckpointError(CadenzaError):
    """A model directory or weight file is missing, unreadable or does not match the architecture."""


class InputError(CadenzaError, ValueError):
    """A request argument (text, audio, speaker, option) cannot be used."""


class TextError(InputError):
    """The text is empty, unspeakable or too long."""


class AudioError(InputError):
    """Prompt audio is unreadable, silent, too short or too long."""


class UnknownSpeakerError(InputError, KeyError):
    """A saved speaker id that the model does not know."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


class UnknownLoRAError(InputError, KeyError):
    """A LoRA adapter name that the model has not registered (the message lists the registered ones)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class LoRAInUseError(InputError):
    """A LoRA adapter cannot be removed while requests that use it are queued or running."""


class VoiceFamilyError(InputError):
    """A saved voice made for another model family than the one asked to speak with it."""


class MissingDependencyError(CadenzaError, ImportError):
    """An optional dependency (extra) is needed for this feature."""


class EngineBusyError(CadenzaError):
    """The engine's request queue is full; retry later (HTTP 429)."""


class RequestCancelledError(CadenzaError):
    """The request was cancelled before it finished."""
