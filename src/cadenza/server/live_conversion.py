"""``/v1/audio/voice-conversion/stream``: live voice conversion over a WebSocket -- source audio in as it is recorded,
the same words in a saved voice (or the model's default voice) out as they are made. CosyVoice 2 models only.

Protocol (JSON text messages, audio as binary messages), one source per connection::

    client: {"type": "session.config", "model"?: str, "voice"?: "alice" | {"id": ...}, "seed"?: int,
             "sample_rate"?: 8000-192000 (the source's, default 16000)}
    server: {"type": "audio.start", "sample_rate": 24000, "format": "pcm_s16le", "seed": ...,
             "input_sample_rate": 16000, "input_format": "pcm_s16le", "max_source_seconds": 240}
    client: binary frames of 16-bit little-endian mono PCM at the source's rate, as it is recorded (each at most
            1 MiB and a whole number of samples)
    client: {"type": "input.done"}
    server: binary frames of 16-bit little-endian mono PCM at the model's rate, as soon as each chunk is made
    server: {"type": "audio.done", "audio_seconds": ..., "source_seconds": ..., "first_chunk_seconds": ...}, then
            closes (1000)

Errors end the session as on ``/v1/audio/speech/stream`` (``ws_protocol.py``): 1007 with the error for a bad message
or source (``param`` ``audio`` for the audio: too long, silent, too short), 1013 busy, 1011 a server fault. The
converted audio for a moment of the source comes about 1.4 s after it, plus the time to make it
(``api/live_conversion.py``). Admission counts the source's seconds as they arrive (the output is as long); a
session takes at most ``max_conversion_seconds`` of source, no longer than ``ws_max_session_s``, and is closed after
``ws_idle_timeout_s`` without audio. The target is always a voice with a consent record or the model's own, and the
output carries the provenance watermark.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Literal

import anyio
import numpy as np
from fastapi import APIRouter, WebSocket
from pydantic import BaseModel, Field
from starlette.websockets import WebSocketDisconnect

from cadenza.api.live_conversion import MAX_RATE, MIN_RATE
from cadenza.audio.wav_stream import pcm16
from cadenza.errors import AudioError
from cadenza.server.engine_stream import EngineStream
from cadenza.server.errors import APIError
from cadenza.server.fields import STRICT, Text, VoiceRef, voice_ref
from cadenza.server.openai_voices import request_voice
from cadenza.server.state import ServerState
from cadenza.server.ws_protocol import (
    CLOSE_BAD_DATA,
    CLOSE_BUSY,
    Deadlines,
    SessionClosed,
    bad_message,
    close_code,
    deliver,
    receive_config,
    serve_session,
)

WS_PATH = "/v1/audio/voice-conversion/stream"
MAX_FRAME_BYTES = 1 << 20
router = APIRouter()


class LiveConfig(BaseModel):
    model_config = STRICT
    type: Literal["session.config"]
    voice: VoiceRef | None = None
    model: Text | None = Field(default=None, max_length=256)
    seed: int | None = Field(default=None, ge=0, lt=2**62)
    sample_rate: int = Field(default=16000, ge=MIN_RATE, le=MAX_RATE)


@router.websocket(WS_PATH)
async def live_conversion(ws: WebSocket) -> None:
    await serve_session(ws, WS_PATH, _session)


async def _session(ws: WebSocket, state: ServerState) -> None:
    cfg = state.config
    deadlines = Deadlines(cfg.ws_idle_timeout_s, cfg.ws_max_session_s)
    config = await receive_config(ws, deadlines, LiveConfig)
    try:
        served = state.model(config.model)
    except APIError as exc:
        raise SessionClosed(CLOSE_BAD_DATA, exc) from exc
    if "voice_conversion" not in served.capabilities.modes:
        raise SessionClosed(CLOSE_BAD_DATA, APIError(
            400, f"{served.capabilities.title} models have no voice conversion (CosyVoice 2 models do)",
            param="model", code="unsupported_value"))
    seed = config.seed if config.seed is not None else secrets.randbits(62)

    def open_live():
        ref = request_voice(served, None if config.voice is None else voice_ref(config.voice))
        if ref is None and not served.capabilities.default_voice:
            raise APIError(400, "this model has no default voice: name a saved voice in session.config",
                           param="voice", code="missing_field")
        voice = None if ref is None else served.prompts.resolve(ref, reveal_names=False)
        return served.tts.live_conversion(config.sample_rate, seed=seed, voice=voice,
                                          max_seconds=cfg.conversion_source_seconds)

    try:
        slot = state.admission.acquire(1.0)  # the source's seconds are added as they arrive
    except APIError as exc:
        raise SessionClosed(CLOSE_BUSY, exc) from exc
    stream: EngineStream | None = None
    try:
        try:
            live = await anyio.to_thread.run_sync(open_live, limiter=state.limiter)
        except Exception as exc:
            error = state.error(exc, param="voice")
            raise SessionClosed(close_code(error, exc), error) from exc
        stream = EngineStream(served.tts.submit, [], limiter=state.limiter, handle=live,
                              max_samples=int(cfg.max_audio_seconds * served.sample_rate))
        await deliver(ws.send_json({"type": "audio.start", "sample_rate": served.sample_rate, "format": "pcm_s16le",
                                    "seed": seed, "input_sample_rate": config.sample_rate,
                                    "input_format": "pcm_s16le", "max_source_seconds": live.max_seconds}))
        await _run(ws, state, live, stream, slot, deadlines, served.sample_rate)
    finally:
        if stream is not None:
            stream.cancel()
        slot.release()


def source_error(exc: AudioError) -> SessionClosed:
    """A bad source (silent, too short, too long, not audio): 1007 naming ``audio``."""
    return SessionClosed(CLOSE_BAD_DATA, APIError(400, str(exc), param="audio", code="invalid_value"))


async def _run(ws: WebSocket, state: ServerState, live, stream: EngineStream, slot, deadlines: Deadlines,
               rate: int) -> None:
    times: dict[str, float] = {"start": time.perf_counter()}
    outcome: list[BaseException] = []

    async def push(samples: np.ndarray) -> None:
        try:
            await anyio.to_thread.run_sync(live.push, samples, limiter=state.limiter)
        except AudioError as exc:
            raise source_error(exc) from exc
        try:
            slot.grow(live.seconds_received - slot.cost)  # the output is as long as the source
        except APIError as exc:
            raise SessionClosed(CLOSE_BUSY, exc) from exc

    async def receive() -> None:
        while True:
            try:
                with anyio.fail_after(deadlines.timeout()):
                    message = await ws.receive()
            except TimeoutError:
                if time.monotonic() >= deadlines.session_at - 0.05:
                    raise deadlines.expired() from None
                raise bad_message(f"no audio for {deadlines.idle_s:g} s before input.done: session closed") from None
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            data = message.get("bytes")
            if data is not None:
                if len(data) > MAX_FRAME_BYTES or len(data) % 2:
                    raise bad_message(f"audio frames are 16-bit mono PCM, a whole number of samples and at most "
                                      f"{MAX_FRAME_BYTES} bytes (got {len(data)})", "audio")
                deadlines.text_arrived()
                await push(np.frombuffer(data, dtype="<i2").astype(np.int16))
                continue
            try:
                kind = json.loads(message.get("text") or "null")
            except ValueError:
                kind = None
            if not (isinstance(kind, dict) and kind.get("type") == "input.done"):
                raise bad_message("after session.config send binary audio frames, then {\"type\": \"input.done\"}",
                                  "type")
            try:
                await anyio.to_thread.run_sync(live.end, limiter=state.limiter)
            except AudioError as exc:
                raise source_error(exc) from exc
            return  # nothing more is read: the rest of the session is sending

    async def send() -> None:
        try:
            while (chunk := await stream.next()) is not None:
                times.setdefault("first_chunk", time.perf_counter())
                await deliver(ws.send_bytes(pcm16(chunk)))
        except AudioError as exc:  # the source's fault, reported to the engine by a push (receive says it too)
            raise source_error(exc) from exc

    async def guarded(fn, tg) -> None:
        try:
            await fn()
        except BaseException as exc:  # noqa: BLE001 - the first failure decides; the other task is cancelled
            if not isinstance(exc, anyio.get_cancelled_exc_class()):
                outcome.append(exc)
                tg.cancel_scope.cancel()
        else:
            if fn is send:
                tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(guarded, receive, tg)
        tg.start_soon(guarded, send, tg)
    if outcome:
        raise outcome[0]
    audio_s = stream.samples / rate
    first = times["first_chunk"] - times["start"] if "first_chunk" in times else None
    if first is not None:
        state.metrics.observe_first_chunk(WS_PATH, first)
    state.metrics.observe_synthesis(WS_PATH, time.perf_counter() - times["start"], audio_s)
    done = {"type": "audio.done", "audio_seconds": round(audio_s, 3), "source_seconds": round(live.seconds_received, 3),
            "first_chunk_seconds": None if first is None else round(first, 3)}
    await deliver(ws.send_json({**done, "truncated": True} if stream.truncated else done))
