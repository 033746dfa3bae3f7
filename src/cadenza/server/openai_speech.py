"""``POST /v1/audio/speech``: OpenAI's text-to-speech endpoint, streamed as the audio is made.

Fields as OpenAI's: ``model`` (a served model's name; with one model any name selects it), ``input`` (<=
``max_input_chars``), ``voice`` (a saved voice's name or id, or ``{"id": ...}``; may be left out for models with a
default voice, which OpenAI's own voice names also select: ``openai_voices``), ``instructions`` (CosyVoice 2: a style instruction; VoxCPM 2: a voice description),
``response_format``, ``speed``, ``stream_format`` (``audio`` | ``sse``). Extensions (pass them with the OpenAI
client's ``extra_body``): ``seed`` (same seed, same audio), ``stream`` (``false``: synthesise the whole utterance
first, then send it with exact sizes and a ``Content-Length``) and ``lora`` (VoxCPM 2: a registered LoRA adapter for
this request alone; ``model: "<model>:<adapter>"`` selects one too) and ``timestamps`` (with ``stream_format: sse``:
a ``speech.word`` event with each word's start and end, sent with the audio; docs/controls.md). Which fields each family honours: docs/server.md;
a field a model cannot honour is a 400 naming it.

Speed (0.5 to 2.0, streamed like speed 1; docs/controls.md, "Speed"): made as the loaded model's
``speed_method`` says — a pitch-preserving time-scale of the output (by default the phase vocoder to speed up, WSOLA to slow down), the mel stretched before
the vocoder (``"mel"``) or the flow rendering fewer frames (``"flow"``, for a flow trained on speaking-rate
pairs). Values OpenAI allows outside that range are refused with 400 rather than faked by resampling (which would shift the pitch).
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
from typing import Literal

import anyio
import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from cadenza.alignment.aligner import WordTiming
from cadenza.alignment.timer import WordTimer
from cadenza.api.arguments import MAX_INSTRUCTIONS_CHARS
from cadenza.engine.silence import keep_silence, with_silences
from cadenza.errors import TextError
from cadenza.server.audio_response import Finish, StreamingAudio, audio_body, first_step, whole_response
from cadenza.server.encoding import MEDIA_TYPES, make_encoder
from cadenza.server.engine_stream import EngineStream
from cadenza.server.errors import APIError
from cadenza.server.fields import STRICT, Text, VoiceId, VoiceRef, bound_text, require_json, voice_ref
from cadenza.server.markup_api import plan_markup
from cadenza.server.openai_voices import request_voice
from cadenza.server.state import ServedModel, ServerState
from cadenza.text.lexicon import MAX_ENTRIES

log = logging.getLogger(__name__)
ENDPOINT = "/v1/audio/speech"

router = APIRouter()


__all__ = ["SpeechRequest", "VoiceId", "router"]

# Admission's first, provisional cost of a request whose text is not planned yet (seconds of audio).
PLANNING_COST_S = 1.0


class SpeechRequest(BaseModel):
    model_config = STRICT

    model: Text = Field(min_length=1, max_length=256)
    input: Text = Field(min_length=1)
    voice: VoiceRef | None = None
    instructions: Text | None = Field(default=None, max_length=MAX_INSTRUCTIONS_CHARS)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    seed: int | None = Field(default=None, ge=0, lt=2**62)
    stream: bool = True
    input_format: Literal["text", "ssml"] | None = None  # extension: SSML (docs/text.md, "SSML")
    lexicon: list[dict] | None = Field(default=None, max_length=MAX_ENTRIES)  # extension: docs/text.md, "Lexicons"
    lora: Text | None = Field(default=None, min_length=1, max_length=64)
    timestamps: bool = False  # extension: speech.word SSE events (docs/controls.md, "Word timestamps")


def _plan(state: ServerState, served: ServedModel, body: SpeechRequest, seed: int,
          lora: str | None = None) -> tuple[list, int, float]:
    """(engine requests, text token count, estimated audio seconds). Blocking: normalises and tokenizes the text,
    resolves the voice (may compute its features) -- in this order, so text over the limits costs no voice work."""
    planned = plan_markup(state, served, body, seed, lora)  # SSML, or a lexicon (the request's or the voice's)
    if planned is not None:
        return planned
    segments = served.tts.segments(body.input, max_tokens=state.config.max_segment_tokens)
    seconds = bound_text(state, segments, speed=body.speed)
    ref = request_voice(served, None if body.voice is None else voice_ref(body.voice))
    voice = None if ref is None else served.prompts.resolve(ref, reveal_names=False)
    instructions = body.instructions if body.instructions and body.instructions.strip() else None
    adapter = {} if lora is None else {"lora": lora}  # only models that take adapters get the argument
    plan = served.tts.plan(segments, voice, instructions=instructions, seed=seed, speed=body.speed, **adapter)
    return plan.requests, plan.text_tokens, seconds


def _check(body: SpeechRequest, state: ServerState, served: ServedModel) -> None:
    limit = state.config.max_input_chars
    if len(body.input) > limit:
        raise APIError(400, f"input is {len(body.input)} characters; the limit is {limit}", param="input",
                       code="string_above_max_length")
    if body.timestamps and body.stream_format != "sse":
        raise APIError(400, "word timestamps are sent as speech.word events: set stream_format to sse (or use the "
                       "WebSocket)", param="timestamps", code="unsupported_value")
    served.check_instructions(body.instructions)
    caps = served.capabilities
    if caps.speed is None:
        if body.speed != 1.0:
            raise APIError(400, f"{caps.title} models have no speaking-rate control: leave speed out or at 1.0 "
                           "(we do not resample, which would change the pitch)", param="speed",
                           code="unsupported_value")
    elif not caps.speed[0] <= body.speed <= caps.speed[1]:
        raise APIError(400, f"speed {body.speed:g} is outside what this model supports ({caps.speed[0]:g} to "
                       f"{caps.speed[1]:g}; the model changes the rate itself and we do not resample, which would "
                       "change the pitch)", param="speed", code="unsupported_value")


@router.post(ENDPOINT, dependencies=[Depends(require_json)])
async def create_speech(body: SpeechRequest, request: Request) -> Response:
    state: ServerState = request.app.state.cadenza
    started = time.perf_counter()
    served, lora = state.route(body.model, body.lora)
    _check(body, state, served)
    seed = body.seed if body.seed is not None else secrets.randbits(62)
    slot = state.admission.acquire(PLANNING_COST_S)
    stream: EngineStream | None = None
    try:
        try:
            requests, n_text, seconds = await anyio.to_thread.run_sync(_plan, state, served, body, seed, lora,
                                                                       limiter=state.limiter)
        except APIError:
            raise
        except Exception as exc:
            param = "instructions" if "instruct" in str(exc) else ("input" if isinstance(exc, TextError) else None)
            raise state.error(exc, param=param) from exc
        slot.grow(seconds - PLANNING_COST_S)
        engine_streaming = body.stream
        sr = served.sample_rate
        stream = EngineStream(with_silences(served.tts.submit), requests, stream=engine_streaming,
                              limiter=state.limiter, max_samples=int(state.config.max_audio_seconds * sr),
                              mark=keep_silence(served.tts.mark.embedder()))
        headers = {"X-Sample-Rate": str(sr), "X-Seed": str(seed), "Cache-Control": "no-cache"}
        if body.stream_format == "audio" and not body.stream:
            try:
                return await whole_response(state, stream, request, body.response_format, headers, started, sr,
                                            ENDPOINT)
            finally:
                stream.cancel()
                slot.release()
        encoder = make_encoder(body.response_format, sr)

        words: list[WordTiming] = []
        timer: list[WordTimer] = []

        def step(chunk: np.ndarray | None) -> tuple[bytes, bool]:
            if body.timestamps:  # in the worker thread, like the encoder: the aligner never blocks the event loop
                if not timer:
                    timer.append(WordTimer(body.input, sr))
                words.extend(timer[0].finish() if chunk is None else timer[0].push(chunk))
            return (encoder.finish(), True) if chunk is None else (encoder.encode(chunk), False)

        first = await first_step(state, stream, step, ENDPOINT, started)
    except BaseException:
        if stream is not None:
            stream.cancel()
        slot.release()
        raise
    finish = Finish(state, stream, slot, started, sr, ENDPOINT)
    if body.stream_format == "sse":
        frame = served.capabilities.output_frame_samples
        return StreamingAudio(_sse(state, stream, step, first, finish, n_text, frame, words), finish,
                          media_type="text/event-stream",
                          headers={**headers, "X-Accel-Buffering": "no"})
    return StreamingAudio(audio_body(stream, step, first, finish), finish, headers=headers,
                      media_type=MEDIA_TYPES[body.response_format])


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def _sse(state: ServerState, stream: EngineStream, step, first, finish: Finish, n_text: int,
               frame_samples: int, words: list[WordTiming] | None = None):
    completed = False
    try:
        data, done = first
        while True:
            events = []
            if data:
                events.append(_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")}))
            while words:  # the word timings this chunk settled, right after it
                events.append(_event({"type": "speech.word", **words.pop(0).to_dict()}))
            if events:  # one write: a burst of small ones to a client that has just gone filled the log with
                yield b"".join(events)  # asyncio's "socket.send() raised exception." before the loss was noticed
            if done:
                break
            try:
                data, done = await stream.map(step)
            except Exception as exc:
                yield _event({"type": "error", **state.error(exc).body()})
                completed = True
                return
        n_out = stream.samples // frame_samples
        done_event = {"type": "speech.audio.done",
                      "usage": {"input_tokens": n_text, "output_tokens": n_out, "total_tokens": n_text + n_out}}
        yield _event({**done_event, "truncated": True} if stream.truncated else done_event)
        completed = True
    finally:
        finish(completed)
