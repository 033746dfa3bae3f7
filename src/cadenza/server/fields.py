"""Request field types the JSON and WebSocket endpoints share: text that is valid Unicode, voices, JSON-only bodies,
and the bound on how much speech one request's text may ask for.

Models are strict (``"stream": "yes"`` or ``"speed": "1.0"`` are type errors, not guesses) and refuse unknown
fields. Strings must be encodable as UTF-8: JSON can carry lone surrogates (``"\\ud800"``), which would otherwise
fail deep inside the tokenizer or the database as a server error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Request
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from cadenza.api.arguments import check_chars
from cadenza.errors import TextError
from cadenza.server.errors import APIError
from cadenza.text.duration import estimate_speech_seconds

if TYPE_CHECKING:
    from cadenza.server.state import ServerState


def unicode_text(value: str) -> str:
    """``value`` if it is valid UTF-8-encodable text without NUL; else ``ValueError`` saying where it is not (the
    API's own check, so a value is refused the same way in Python and over HTTP)."""
    try:
        return check_chars(value, "the value")
    except TextError as exc:
        raise ValueError(str(exc)) from None


Text = Annotated[str, AfterValidator(unicode_text)]
STRICT = ConfigDict(extra="forbid", strict=True)


class VoiceId(BaseModel):
    model_config = STRICT
    id: Text = Field(min_length=1, max_length=128)


VoiceRef = Annotated[Text | VoiceId, Field(union_mode="left_to_right")]
MAX_VOICE_REF_CHARS = 128


def voice_ref(voice: str | VoiceId) -> str:
    """The voice's name or id as a string; a 400 naming ``voice`` when it is longer than any name or id can be."""
    ref = voice.id if isinstance(voice, VoiceId) else voice
    if not ref.strip():
        raise APIError(400, "voice is empty: give a saved voice's name or id", param="voice", code="invalid_value")
    if len(ref) > MAX_VOICE_REF_CHARS:
        raise APIError(400, f"voice is {len(ref)} characters: no voice name or id is longer than "
                       f"{MAX_VOICE_REF_CHARS}", param="voice", code="voice_not_found")
    return ref


async def require_json(request: Request) -> None:
    """FastAPI dependency for JSON routes: 415 unless the body is declared ``application/json``.

    HTML forms can post ``text/plain``, ``application/x-www-form-urlencoded`` and ``multipart/form-data`` across
    sites without a CORS preflight; a JSON route that only takes JSON is out of their reach.
    """
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise APIError(415, f"send the request body as JSON with 'Content-Type: application/json' (got "
                       f"{media[:60] or 'none'!r})", code="unsupported_media_type")


def bound_text(state: ServerState, segments: list[str], param: str = "input", speed: float = 1.0) -> float:
    """Seconds of audio the normalised ``segments`` should make at ``speed``; a 400 naming ``param`` when the text or
    that estimate is over the server's limits (before any synthesis work: past ``max_audio_seconds`` the audio would
    be cut there)."""
    cfg = state.config
    n_chars = sum(len(s) for s in segments)
    if n_chars > cfg.max_normalized_chars:
        raise APIError(400, f"{param} reads out to {n_chars} characters (numbers and symbols spelled out); the limit "
                       f"is {cfg.max_normalized_chars}", param=param, code="string_above_max_length")
    seconds = sum(estimate_speech_seconds(s) for s in segments) / speed
    if seconds > cfg.max_audio_seconds:
        at = "" if speed == 1.0 else f" at speed {speed:g}"
        raise APIError(400, f"{param} would make about {seconds:.0f} s of audio{at}; one request may make at most "
                       f"{cfg.max_audio_seconds:g} s: split it into several requests", param=param,
                       code="audio_above_max_duration")
    return seconds
