"""OpenAI's stock voice names (``alloy``, ``nova`` ...) as the served model's default voice.

OpenAI's clients must name one of its voices, so code written for OpenAI sends ``voice: "alloy"``. Such a name that
is neither a saved voice nor a speaker of the model stands for the model's default voice (as OpenAI's model names
stand for the default model), so that the code works unchanged; a voice saved under that name is used as any other.
A model without a default voice refuses it, saying how to make one.
"""

from __future__ import annotations

from cadenza.errors import UnknownSpeakerError

# OpenAI's text-to-speech voices (platform.openai.com/docs/guides/text-to-speech), lower case.
OPENAI_VOICE_NAMES = frozenset(("alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx",
                                "sage", "shimmer", "verse"))


def request_voice(served, ref: str | None) -> str | None:
    """The voice ``ref`` stands for on ``served`` (a ``ServedModel``): ``ref`` itself when it is a saved voice or a
    speaker of the model, ``None`` (the model's default voice) for an OpenAI voice name that is neither. Raises
    ``UnknownSpeakerError`` otherwise. Blocking (reads the voice store); no feature work."""
    if ref is None:
        return None
    try:
        served.prompts.lookup(ref, reveal_names=False)
        return ref
    except UnknownSpeakerError:
        if ref.lower() not in OPENAI_VOICE_NAMES:
            raise
    if not served.capabilities.default_voice:
        raise UnknownSpeakerError(
            f"{ref!r} is one of OpenAI's voices, which stand for the model's default voice here, and this model has "
            f"none: save a voice named {ref!r} (POST /v1/audio/voices) or name a saved voice")
    return None
