"""``/v1/audio/speech/stream``: bi-streaming over a WebSocket -- text in as it is written, audio out as it is made.

Protocol (JSON text messages, audio as binary messages), one utterance per connection::

    client: {"type": "session.config", "voice": "alice" | {"id": ...}, "instructions"?: str, "seed"?: int}
    server: {"type": "audio.start", "sample_rate": 24000, "format": "pcm_s16le", "seed": ...}
    client: {"type": "input.text", "text": "Hello "}   (any number of pieces)
    client: {"type": "input.done"}
    server: binary frames of 16-bit little-endian mono PCM, as soon as each chunk is ready
    server: {"type": "audio.done", "audio_seconds": ..., "first_chunk_seconds": ...}, then closes (1000)

Errors: ``{"type": "error", "error": {"message", "type", "param", "code"}}``, then the server closes (1007 bad
message, 1008 not authorised, 1011 server error, 1013 busy). The text pieces are tokenized as they arrive and fed
to the engine's bi-streaming LM (``engine.build_bistream`` + ``stream_bistream``), so audio starts before the text
ends. A client that disconnects, or sends nothing for ``ws_idle_timeout_s`` before ``input.done``, cancels the
request and frees its engine state.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from typing import Literal

import anyio
import torch
from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.websockets import WebSocketDisconnect

from cadenza.errors import InputError, TextError
from cadenza.models.cosyvoice2.frontend import check_speakable
from cadenza.server.auth import authorized
from cadenza.server.encoding import pcm16
from cadenza.server.engine_stream import EngineStream
from cadenza.server.errors import APIError, from_exception
from cadenza.server.openai_speech import VoiceId
from cadenza.server.state import ServerState

log = logging.getLogger(__name__)
WS_PATH = "/v1/audio/speech/stream"
CLOSE_OK, CLOSE_BAD_DATA, CLOSE_POLICY, CLOSE_ERROR, CLOSE_BUSY = 1000, 1007, 1008, 1011, 1013

router = APIRouter()


class SessionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["session.config"]
    voice: str | VoiceId = Field(union_mode="left_to_right")
    instructions: str | None = Field(default=None, max_length=4096)
    seed: int | None = Field(default=None, ge=0, lt=2**62)
    model: str | None = Field(default=None, max_length=256)
    response_format: Literal["pcm"] = "pcm"


class _Close(Exception):
    """End the session: send ``error`` (if any) and close with ``code``."""

    def __init__(self, code: int, error: APIError | None = None) -> None:
        super().__init__(code)
        self.code, self.error = code, error


def _bad(message: str, param: str | None = None) -> _Close:
    return _Close(CLOSE_BAD_DATA, APIError(400, message, param=param, code="invalid_message"))


def _close_code(error: APIError, exc: BaseException | None = None) -> int:
    """1013 busy, 1007 the client's input was bad, 1011 anything else (the engine failed)."""
    if error.status == 429:
        return CLOSE_BUSY
    if error.status >= 500 or (exc is not None and not isinstance(exc, (InputError, APIError))):
        return CLOSE_ERROR
    return CLOSE_BAD_DATA


async def _receive_json(ws: WebSocket, timeout: float | None) -> dict:
    with anyio.fail_after(timeout):  # None: no deadline
        message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    if message.get("text") is None:
        raise _bad("send JSON text messages (binary messages are not accepted)")
    try:
        data = json.loads(message["text"])
    except json.JSONDecodeError as exc:
        raise _bad(f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise _bad("every message is a JSON object with a string 'type'", "type")
    return data


@router.websocket(WS_PATH)
async def speech_stream(ws: WebSocket) -> None:
    state: ServerState = ws.app.state.cadenza
    if not authorized(ws.headers.get("authorization"), state.config.api_key):
        state.metrics.count_request(WS_PATH, CLOSE_POLICY)
        error = APIError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                         code="invalid_api_key")
        if "websocket.http.response" in ws.scope.get("extensions", {}) and hasattr(ws, "send_denial_response"):
            await ws.send_denial_response(JSONResponse(error.body(), status_code=401))
        else:
            await ws.close(CLOSE_POLICY)
        return
    await ws.accept()
    code = CLOSE_OK
    try:
        await _session(ws, state)
    except _Close as close:
        code = close.code
        if close.error is not None:
            await _send_error(ws, close.error)
    except WebSocketDisconnect:
        code = 1001
        state.metrics.count_disconnect()
    except Exception as exc:  # noqa: BLE001 - never let a session take the server down
        error = from_exception(exc, state.config.retry_after_s)
        code = _close_code(error, exc)
        await _send_error(ws, error)
    state.metrics.count_request(WS_PATH, code)
    if code != 1001:
        try:
            await ws.close(code)
        except (RuntimeError, WebSocketDisconnect, OSError):
            pass  # already closed by the client


async def _send(sending) -> None:
    """Await a send; a connection the client already closed reads as a disconnect, not a server error."""
    try:
        await sending
    except OSError as exc:  # uvicorn's ClientDisconnected and plain socket errors
        raise WebSocketDisconnect(1006) from exc


async def _send_error(ws: WebSocket, error: APIError) -> None:
    try:
        await ws.send_json({"type": "error", **error.body()})
    except (RuntimeError, WebSocketDisconnect, OSError):
        pass


async def _session(ws: WebSocket, state: ServerState) -> None:
    cfg = state.config
    data = await _receive_json(ws, cfg.ws_idle_timeout_s)
    try:
        config = SessionConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise _bad(f"the first message must be a valid session.config: {param}: {first.get('msg')}", param) from exc
    seed = config.seed if config.seed is not None else secrets.randbits(62)
    instructions = config.instructions if config.instructions and config.instructions.strip() else None
    ref = config.voice.id if isinstance(config.voice, VoiceId) else config.voice
    try:
        slot = state.admission.acquire()
    except APIError as exc:
        raise _Close(CLOSE_BUSY, exc) from exc
    stream: EngineStream | None = None
    try:
        def start():
            voice = state.prompts.resolve(ref)
            request = state.prompts.build_bistream(voice, instructions, seed)
            return state.tts.engine.stream_bistream(request)

        try:
            handle = await anyio.to_thread.run_sync(start, limiter=state.limiter)
        except Exception as exc:
            error = from_exception(exc, cfg.retry_after_s)
            raise _Close(_close_code(error, exc), error) from exc
        stream = EngineStream(state.submit, [], limiter=state.limiter, handle=handle)
        await _send(ws.send_json({"type": "audio.start", "sample_rate": state.sample_rate, "format": "pcm_s16le",
                                  "seed": seed}))
        await _run(ws, state, handle, stream)
    finally:
        if stream is not None:
            stream.cancel()
        slot.release()


async def _run(ws: WebSocket, state: ServerState, handle, stream: EngineStream) -> None:
    cfg = state.config
    encoder = state.tts.engine.frontend.text_stream_encoder()
    times: dict[str, float] = {}
    outcome: list[BaseException] = []

    async def receive() -> None:
        chars = 0
        done = False
        received: list[str] = []
        while True:
            data = await _receive_json(ws, None if done else cfg.ws_idle_timeout_s)
            kind = data["type"]
            if done:
                raise _bad(f"no messages are expected after input.done (got {kind!r})")
            if kind == "input.text":
                text = data.get("text")
                if not isinstance(text, str):
                    raise _bad("input.text needs a string 'text'", "text")
                chars += len(text)
                if chars > cfg.max_input_chars:
                    raise _bad(f"the text is longer than {cfg.max_input_chars} characters", "text")
                received.append(text)
                times.setdefault("first_text", time.perf_counter())
                ids = encoder.feed(text)
                if ids:
                    handle.feed_text(torch.tensor([ids], dtype=torch.long))
            elif kind == "input.done":
                # Nothing speakable at all is the client's error (and the engine's bi-streaming LM would wait
                # forever for a first text token).
                try:
                    check_speakable("".join(received))
                except TextError as exc:
                    raise _bad(f"nothing to speak before input.done: {exc}", "text") from exc
                times.setdefault("first_text", time.perf_counter())
                ids = encoder.flush()
                if ids:
                    handle.feed_text(torch.tensor([ids], dtype=torch.long))
                handle.end_text()
                done = True
            else:
                raise _bad(f"unknown message type {kind!r} (expected input.text or input.done)", "type")

    async def send() -> None:
        while (chunk := await stream.next()) is not None:
            if "first_chunk" not in times:
                times["first_chunk"] = time.perf_counter()
            await _send(ws.send_bytes(pcm16(chunk)))

    async def guarded(fn, tg) -> None:
        try:
            await fn()
        except BaseException as exc:  # noqa: BLE001 - the first outcome decides; the other task is cancelled
            if not isinstance(exc, anyio.get_cancelled_exc_class()):
                outcome.append(exc)
        else:
            if fn is send:
                outcome.append(StopAsyncIteration())
        finally:
            tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(guarded, receive, tg)
        tg.start_soon(guarded, send, tg)
    result = outcome[0] if outcome else StopAsyncIteration()
    if isinstance(result, TimeoutError):
        raise _bad(f"no message for {cfg.ws_idle_timeout_s:g} s before input.done: session closed")
    if not isinstance(result, StopAsyncIteration):
        raise result
    audio_s = stream.samples / state.sample_rate
    start = times.get("first_text", stream.started)
    first = times["first_chunk"] - start if "first_chunk" in times else None
    if first is not None:
        state.metrics.observe_first_chunk(WS_PATH, first)
    state.metrics.observe_synthesis(WS_PATH, time.perf_counter() - start, audio_s)
    await _send(ws.send_json({"type": "audio.done", "audio_seconds": round(audio_s, 3),
                              "first_chunk_seconds": None if first is None else round(first, 3)}))
