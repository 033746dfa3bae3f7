"""SSML and pronunciation lexicons over HTTP.

``POST /v1/audio/speech`` takes two documented extensions (OpenAI has neither): ``input_format`` (``"text"`` |
``"ssml"``; left out, an input that starts with ``<speak`` is SSML) and ``lexicon`` (entries for this request,
``[{"word": ..., "respelling": ...} | {"word": ..., "phonemes": ...}, ...]``). A saved voice's own lexicon applies
whenever the voice speaks; the request's entries win over it for the same word. ``plan_markup`` plans such a
request: a 400 names the SSML tag and its line and column, or the lexicon entry.

A voice's lexicon: ``PUT /v1/audio/voices/{voice}/lexicon`` (``{"entries": [...]}``, replaces it),
``GET`` (the entries) and ``DELETE``; it is deleted with its voice.
"""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from cadenza.api import markup
from cadenza.errors import InputError, TextError, UnknownSpeakerError
from cadenza.server.errors import APIError
from cadenza.server.fields import STRICT, bound_text, require_json, voice_ref
from cadenza.server.openai_voices import request_voice
from cadenza.server.state import ServedModel, ServerState
from cadenza.text.lexicon import MAX_ENTRIES, Lexicon
from cadenza.voices.lexicons import lexicons_of

router = APIRouter()


def parse_lexicon(entries: list | None, param: str = "lexicon") -> Lexicon | None:
    if entries is None:
        return None
    try:
        return Lexicon.from_json(entries, param)
    except InputError as exc:
        raise APIError(400, str(exc), param=param, code="invalid_lexicon") from None


def plan_markup(state: ServerState, served: ServedModel, body, seed: int,
                lora: str | None = None) -> tuple[list, int, float] | None:
    """(engine requests with ``Silence`` items, text tokens, estimated seconds) of an SSML request or one with a
    lexicon (the request's or its voice's); None for plain text, which keeps the usual path. Blocking."""
    request_lexicon = parse_lexicon(body.lexicon)
    ref = None if body.voice is None else voice_ref(body.voice)
    saved = None if ref is None else markup.voice_lexicon(state.voices, ref)
    ssml = markup.is_ssml(body.input, body.input_format)
    if not ssml and request_lexicon is None and saved is None:
        return None
    lexicon = saved if request_lexicon is None else request_lexicon.over(saved)
    return plan_document(state, served, body.input, input_format=body.input_format, lexicon=lexicon, voice=ref,
                         instructions=body.instructions, speed=body.speed, seed=seed, lora=lora)


def plan_document(state: ServerState, served: ServedModel, text: str, *, input_format: str | None,
                  lexicon: Lexicon | None, voice: str | None, instructions: str | None, speed: float, seed: int,
                  lora: str | None = None, param: str = "input") -> tuple[list, int, float]:
    """``text`` (SSML or plain, ``lexicon`` applied) -> (engine requests with ``Silence`` items, text tokens,
    estimated seconds): the HTTP request's path, and each SSML document of a WebSocket session. A 400 names the SSML
    tag and its line and column (``param``: the text's field) or the lexicon entry (``lexicon``). Blocking."""
    ssml = markup.is_ssml(text, input_format)
    try:
        script = markup.make_script(served.tts, text, input_format=input_format, lexicon=lexicon,
                                    max_tokens=state.config.max_segment_tokens, speed=speed)
    except TextError:
        raise
    except InputError as exc:
        where = "lexicon" if str(exc).startswith("lexicon entry") else param
        raise APIError(400, str(exc), param=where, code="invalid_ssml" if ssml and where == param
                       else "invalid_value") from None
    seconds = bound_text(state, markup.script_text(script), param, speed) + markup.pause_seconds(script)
    if seconds > state.config.max_audio_seconds:
        raise APIError(400, f"{param} would make about {seconds:.0f} s of audio with its breaks; one request may make "
                       f"at most {state.config.max_audio_seconds:g} s", param=param,
                       code="audio_above_max_duration")
    voice = request_voice(served, voice)
    prompt = None if voice is None else served.prompts.resolve(voice, reveal_names=False)
    instructions = instructions if instructions and instructions.strip() else None
    items, n_text = markup.plan_script(served.tts, script, prompt, instructions=instructions, seed=seed,
                                       **({} if lora is None else {"lora": lora}))
    return items, n_text, seconds


# -- a voice's lexicon -------------------------------------------------------------------------------------------------
class LexiconBody(BaseModel):
    model_config = STRICT
    entries: list[dict] = Field(max_length=MAX_ENTRIES)


def _voice_error(voice: str) -> APIError:
    return APIError(404, f"no saved voice {voice[:80]!r}", param="voice_id", code="voice_not_found")


def _answer(voice_id: str, lexicon: Lexicon) -> JSONResponse:
    return JSONResponse({"object": "audio.voice.lexicon", "voice_id": voice_id, **lexicon.to_json()})


def check_readable(served: ServedModel, lexicon: Lexicon) -> None:
    """A 400 naming the first entry a model that speaks the voice could not read (a phoneme symbol it lacks, a
    respelling in a script it does not read): each entry's word is read through the lexicon as a request's text
    would be, so a saved lexicon never makes the voice's later requests fail on that word. Blocking."""
    frontend = getattr(served.tts.engine, "frontend", None)
    for entry in lexicon.entries:
        try:
            script = markup.make_script(served.tts, entry.word, input_format="text", lexicon=Lexicon([entry]))
            if frontend is not None:
                for segment in markup.script_text(script):
                    frontend.text_ids(segment)
        except InputError as exc:  # TextError included
            message = str(exc).removeprefix(f"lexicon entry {entry.word!r}: ")
            raise APIError(400, f"entry {entry.word!r}: {message} (model {served.name})", param="entries",
                           code="invalid_lexicon") from None


@router.put("/v1/audio/voices/{voice}/lexicon", dependencies=[Depends(require_json)])
async def put_lexicon(voice: str, body: LexiconBody, request: Request) -> JSONResponse:
    state: ServerState = request.app.state.cadenza
    lexicon = parse_lexicon(body.entries, "entries")

    def put() -> str:
        try:
            family = state.voices.get(voice).family
        except UnknownSpeakerError as exc:
            raise _voice_error(voice) from exc
        for served in state.models.values():
            if served.capabilities.family == family:
                check_readable(served, lexicon)
        try:
            return lexicons_of(state.voices).put(voice, lexicon).id
        except UnknownSpeakerError as exc:
            raise _voice_error(voice) from exc

    voice_id = await anyio.to_thread.run_sync(put, limiter=state.limiter)
    return _answer(voice_id, lexicon)


@router.get("/v1/audio/voices/{voice}/lexicon")
async def get_lexicon(voice: str, request: Request) -> JSONResponse:
    state: ServerState = request.app.state.cadenza

    def get() -> tuple[str, Lexicon]:
        try:
            return state.voices.get(voice).id, lexicons_of(state.voices).get(voice)
        except UnknownSpeakerError as exc:
            raise _voice_error(voice) from exc

    return _answer(*await anyio.to_thread.run_sync(get, limiter=state.limiter))


@router.delete("/v1/audio/voices/{voice}/lexicon")
async def delete_lexicon(voice: str, request: Request) -> JSONResponse:
    state: ServerState = request.app.state.cadenza

    def clear() -> tuple[str, bool]:
        try:
            return state.voices.get(voice).id, lexicons_of(state.voices).clear(voice)
        except UnknownSpeakerError as exc:
            raise _voice_error(voice) from exc

    voice_id, deleted = await anyio.to_thread.run_sync(clear, limiter=state.limiter)
    return JSONResponse({"object": "audio.voice.lexicon.deleted", "voice_id": voice_id, "deleted": deleted})
