"""Saved voices over HTTP: ``POST/GET /v1/audio/voices``, ``GET/DELETE /v1/audio/voices/{id}``.

Creating a voice takes a multipart form: ``audio`` (the recording; ``audio_sample`` is accepted too), ``name``,
``consent`` (the speaker's consent statement, required, stored verbatim with the time), ``transcript`` (optional:
without it a CosyVoice 2 voice is used cross-lingually, a VoxCPM 2 voice as a reference), ``model`` (optional: the
served model the voice is for, default the first; a voice belongs to that model's family) and, for VoxCPM 2,
``cloning`` (``reference``, ``continuation`` or ``combined``). The recording is validated (size, duration,
silence), its prompt features are computed with that model, and only then is it saved (one transaction) -- so a
voice the model cannot use (e.g. a transcript with nothing to speak) is refused at creation and leaves nothing
behind.
"""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from cadenza.errors import AudioError, TextError, UnknownSpeakerError
from cadenza.server.errors import APIError
from cadenza.server.multipart import bool_field, decode_upload, read_audio_file, read_form, text_field
from cadenza.server.state import ServedModel, ServerState
from cadenza.voices import VoiceRecord

router = APIRouter()
AUDIO_FIELDS = ("audio", "audio_sample", "file")
VOICE_FIELDS = (*AUDIO_FIELDS, "name", "consent", "transcript", "model", "cloning", "declared_by", "keep_audio",
                "audio_retention_days")


def _public(record: VoiceRecord) -> dict:
    return {"object": "audio.voice", "id": record.id, "name": record.name, "transcript": record.transcript,
            "consent": record.consent, "consent_at": record.consent_at, "declared_by": record.declared_by,
            "audio_sha256": record.audio_sha256, "created_at": int(record.created_at),
            "duration": round(record.duration, 3), "sample_rate": record.sample_rate, "family": record.family,
            "cloning": record.cloning, "audio_kept": record.audio_kept, "audio_expires_at": record.audio_expires_at}


def _add(state: ServerState, served: ServedModel, name: str, data: bytes, transcript: str | None, consent: str,
         cloning: str | None, declared_by: str | None, keep: tuple[bool, float | None]) -> VoiceRecord:
    """Blocking: check the fields, decode (bounded), compute the prompt features, then save in one transaction."""
    cfg = state.config
    state.voices.check_new(name, transcript, consent)  # the cheap refusals before any decoding
    served.prompts.check_cloning(transcript, cloning)
    wav, sr = decode_upload(data, cfg.max_upload_bytes, cfg.max_prompt_seconds)
    return served.prompts.create(name, (wav.numpy(), sr), transcript, consent, max_seconds=cfg.max_prompt_seconds,
                                 cloning=cloning, declared_by=declared_by, keep_audio=keep[0], audio_ttl_s=keep[1])


def _param_of(exc: Exception) -> str | None:
    """Which form field an error is about (for the error's ``param``)."""
    if isinstance(exc, AudioError):
        return "audio"
    if isinstance(exc, TextError):  # the model's check of the transcript
        return "transcript"
    msg = str(exc)
    if "taken down" in msg:
        return "audio"
    return next((f for f in ("cloning", "declared_by", "name", "consent", "transcript") if f in msg), None)


def _text_field(form, name: str, required: bool) -> str | None:
    what = "a consent statement (the speaker's permission to clone their voice)" if name == "consent" else None
    return text_field(form, name, required, what)


def _retention(form) -> tuple[bool, float | None]:
    """(keep the recording, for how many seconds) from ``keep_audio`` ("true"/"false", default false) and
    ``audio_retention_days`` (only with keep_audio)."""
    kept = bool_field(form, "keep_audio", False)
    days = _text_field(form, "audio_retention_days", False)
    if days is None:
        return kept, None
    try:
        value = float(days)
    except ValueError:
        value = float("nan")
    if not kept or not (0 < value <= 3650):
        raise APIError(400, "audio_retention_days is a number of days in (0, 3650], with keep_audio=true",
                       param="audio_retention_days", code="invalid_value")
    return True, value * 86400.0


@router.post("/v1/audio/voices", status_code=201)
async def create_voice(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.cadenza
    form = await read_form(request, fields=VOICE_FIELDS, max_files=1, not_multipart="send the voice as multipart/form-data "
                           "with fields audio, name, consent and optional transcript")
    try:
        data = await read_audio_file(form, AUDIO_FIELDS, state.config.max_upload_bytes)
        name = _text_field(form, "name", True)
        consent = _text_field(form, "consent", True)
        transcript = _text_field(form, "transcript", False)
        served = state.model(_text_field(form, "model", False))
        cloning = _text_field(form, "cloning", False)
        declared_by = _text_field(form, "declared_by", False)
        keep = _retention(form)
        try:
            record = await anyio.to_thread.run_sync(_add, state, served, name, data, transcript, consent, cloning,
                                                    declared_by, keep, limiter=state.limiter)
        except Exception as exc:
            raise state.error(exc, param=_param_of(exc)) from exc
    finally:
        await form.close()
    return JSONResponse(_public(record), status_code=201)


@router.get("/v1/audio/voices")
async def list_voices(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.cadenza
    records = await anyio.to_thread.run_sync(state.voices.list, limiter=state.limiter)
    return JSONResponse([{"id": r.id, "name": r.name, "family": r.family} for r in records])


def _get(state: ServerState, voice: str) -> VoiceRecord:
    try:
        return state.voices.get(voice)
    except UnknownSpeakerError as exc:
        raise APIError(404, f"no saved voice {voice[:80]!r}", param="voice_id", code="voice_not_found") from exc


@router.get("/v1/audio/voices/{voice}")
async def get_voice(voice: str, request: Request) -> JSONResponse:
    state: ServerState = request.app.state.cadenza
    return JSONResponse(_public(await anyio.to_thread.run_sync(_get, state, voice, limiter=state.limiter)))


@router.delete("/v1/audio/voices/{voice}")
async def delete_voice(voice: str, request: Request) -> JSONResponse:
    state: ServerState = request.app.state.cadenza

    def delete() -> str:
        record = _get(state, voice)
        try:
            state.voices.delete(record.id)
        except UnknownSpeakerError as exc:  # deleted by someone else in between
            raise APIError(404, f"no saved voice {voice[:80]!r}", param="voice_id", code="voice_not_found") from exc
        for served in state.models.values():
            served.prompts.forget(record.id)
        return record.id

    voice_id = await anyio.to_thread.run_sync(delete, limiter=state.limiter)
    return JSONResponse({"object": "audio.voice.deleted", "id": voice_id, "deleted": True})


@router.get("/v1/audio/voices/{voice}/consent")
async def voice_consent(voice: str, request: Request) -> JSONResponse:
    """The voice's consent record (declaration, who made it and when, the recording's hash, use count)."""
    state: ServerState = request.app.state.cadenza
    record = await anyio.to_thread.run_sync(_get, state, voice, limiter=state.limiter)
    consent = await anyio.to_thread.run_sync(state.voices.consent_record, record.id, limiter=state.limiter)
    return JSONResponse({"object": "audio.voice.consent", **consent})
