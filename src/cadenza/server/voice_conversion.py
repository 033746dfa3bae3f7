"""``POST /v1/audio/voice-conversion``: say what an uploaded recording says in a saved voice (or the model's default
voice), streamed as the audio is made. CosyVoice 2 models only (``voice_conversion`` in their ``modes``).

A multipart form (as ``/v1/audio/voices``): ``audio`` (the source recording, any rate and container the voice
upload takes, at most ``max_conversion_seconds``, 240 s by default; past 30 s it is read in windows and rendered
chunk by chunk: ``api/voice_conversion.py``), ``voice`` (a saved voice's name or id, or a speaker of the model; left
out, or one of OpenAI's voice names: the model's default voice), ``model``,
``source_text`` (what the recording says: models whose speech tokens are phonemes, the built-in one, then place the
tokens by alignment and keep the words of voices they never heard; docs/cadenza-tiny.md), ``response_format``
(``mp3`` default, ``opus``, ``aac``, ``flac``, ``wav``, ``pcm``), ``seed``, ``stream`` (``false``: the whole utterance
with exact sizes). The target voice is always one with a consent record or the model's own: the endpoint takes no
second recording to clone from. Outputs carry the provenance watermark like every synthesis (docs/provenance.md).
"""

from __future__ import annotations

import secrets
import time

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response

from cadenza.api.voice_conversion import SOURCE_WORDING, renders_whole
from cadenza.errors import AudioError, InputError, TextError, UnknownSpeakerError
from cadenza.server.audio_response import Finish, StreamingAudio, audio_body, first_step, whole_response
from cadenza.server.encoding import MEDIA_TYPES, make_encoder
from cadenza.server.engine_stream import EngineStream
from cadenza.server.errors import APIError
from cadenza.server.multipart import bool_field, decode_upload, read_audio_file, read_form, text_field
from cadenza.server.openai_voices import request_voice
from cadenza.server.state import ServedModel, ServerState

ENDPOINT = "/v1/audio/voice-conversion"
router = APIRouter()
FIELDS = ("audio", "voice", "model", "source_text", "response_format", "seed", "stream")
PLANNING_COST_S = 1.0  # admission's first cost, before the source's length is known (seconds of audio)


def _options(form) -> tuple[str, int | None, bool]:
    """(response_format, seed, stream) from the form, each checked."""
    fmt = (text_field(form, "response_format") or "mp3").strip().lower()
    if fmt not in MEDIA_TYPES:
        raise APIError(400, f"response_format {fmt[:32]!r} is not one of {', '.join(MEDIA_TYPES)}",
                       param="response_format", code="invalid_value")
    seed_text = text_field(form, "seed")
    seed = None
    if seed_text is not None:
        try:
            seed = int(seed_text.strip())
        except ValueError:
            seed = -1
        if not 0 <= seed < 2**62:
            raise APIError(400, "seed is an integer from 0 to 2**62 - 1", param="seed", code="invalid_value")
    return fmt, seed, bool_field(form, "stream", True)


def _decode(state: ServerState, served: ServedModel, data: bytes, voice_ref: str | None):
    """Blocking: (the target voice or ``None`` for the default, source samples ``[N]``, their rate). The voice is
    resolved before the audio is decoded, so an unknown voice costs no decoding; the source is decoded within the
    upload limits (``decode_upload``)."""
    ref = request_voice(served, voice_ref)
    if ref is None and not served.capabilities.default_voice:
        raise UnknownSpeakerError("this model has no default voice: name a saved voice (field 'voice')")
    voice = None if ref is None else served.prompts.resolve(ref, reveal_names=False)
    wav, sr = decode_upload(data, state.config.max_upload_bytes, state.config.conversion_source_seconds, **SOURCE_WORDING)
    return voice, wav, sr


def _param_of(exc: Exception) -> str | None:
    if isinstance(exc, AudioError):
        return "audio"
    if isinstance(exc, UnknownSpeakerError):
        return "voice"
    if isinstance(exc, TextError) or (isinstance(exc, InputError) and "transcript" in str(exc)):
        return "source_text"  # also a source_text that does not fit the recording
    return None


@router.post(ENDPOINT)
async def convert_voice(request: Request) -> Response:
    state: ServerState = request.app.state.cadenza
    started = time.perf_counter()
    form = await read_form(request, fields=FIELDS, max_files=1,
                           not_multipart="send the source recording as multipart/form-data (file field 'audio', "
                                         "optional fields voice, model, source_text, response_format, seed, stream)")
    try:
        data = await read_audio_file(form, ("audio",), state.config.max_upload_bytes)
        fmt, seed, stream = _options(form)
        served = state.model(text_field(form, "model"))
        voice_ref = text_field(form, "voice") or None  # an empty field (a blank form input) is a field left out
        source_text = text_field(form, "source_text") or None
    finally:
        await form.close()
    if "voice_conversion" not in served.capabilities.modes:
        raise APIError(400, f"{served.capabilities.title} models have no voice conversion (CosyVoice 2 models do)",
                       param="model", code="unsupported_value")
    seed = seed if seed is not None else secrets.randbits(62)
    slot = state.admission.acquire(PLANNING_COST_S)
    engine: EngineStream | None = None
    try:
        try:
            voice, wav, rate = await anyio.to_thread.run_sync(_decode, state, served, data, voice_ref,
                                                              limiter=state.limiter)
            slot.grow(wav.numel() / rate - PLANNING_COST_S)  # the output is as long as the source: 429 before work
            plan = await anyio.to_thread.run_sync(
                lambda: served.tts.conversion_plan((wav.numpy(), rate), voice, source_text=source_text, seed=seed,
                                                   max_seconds=state.config.conversion_source_seconds),
                limiter=state.limiter)
        except APIError:
            raise
        except Exception as exc:
            raise state.error(exc, param=_param_of(exc)) from exc
        requests = plan.requests
        sr = served.sample_rate
        # a source past 30 s is rendered chunk by chunk even when asked whole (``renders_whole``): the same path
        engine = EngineStream(served.tts.submit, requests, stream=stream or not renders_whole(requests[0]),
                              limiter=state.limiter,
                              max_samples=int(state.config.max_audio_seconds * sr), mark=served.tts.mark.embedder())
        headers = {"X-Sample-Rate": str(sr), "X-Seed": str(seed), "Cache-Control": "no-cache"}
        if not stream:
            try:
                return await whole_response(state, engine, request, fmt, headers, started, sr, ENDPOINT)
            finally:
                engine.cancel()
                slot.release()
        encoder = make_encoder(fmt, sr)

        def step(chunk):
            return (encoder.finish(), True) if chunk is None else (encoder.encode(chunk), False)

        first = await first_step(state, engine, step, ENDPOINT, started)
    except BaseException:
        if engine is not None:
            engine.cancel()
        slot.release()
        raise
    finish = Finish(state, engine, slot, started, sr, ENDPOINT)
    return StreamingAudio(audio_body(engine, step, first, finish), finish, headers=headers,
                          media_type=MEDIA_TYPES[fmt])
