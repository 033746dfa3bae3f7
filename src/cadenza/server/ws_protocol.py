"""The WebSocket speech protocol's messages and endings (``websocket.py`` runs the sessions): the ``session.config``
message, the close codes, the ``SessionClosed`` that ends a session with an error message, reading JSON messages,
sending without mistaking a client's disconnect for a server error, and a session's two deadlines."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Literal

import anyio
from fastapi import WebSocket
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.websockets import WebSocketDisconnect

from cadenza.api.arguments import MAX_INSTRUCTIONS_CHARS
from cadenza.errors import InputError
from cadenza.server.auth import WS_PROTOCOL, authorized, websocket_authorization
from cadenza.server.errors import APIError
from cadenza.server.fields import STRICT, Text, VoiceRef
from cadenza.text.lexicon import MAX_ENTRIES

CLOSE_OK, CLOSE_BAD_DATA, CLOSE_POLICY, CLOSE_ERROR, CLOSE_BUSY = 1000, 1007, 1008, 1011, 1013


class SessionConfig(BaseModel):
    model_config = STRICT
    type: Literal["session.config"]
    voice: VoiceRef | None = None
    instructions: Text | None = Field(default=None, max_length=MAX_INSTRUCTIONS_CHARS)
    seed: int | None = Field(default=None, ge=0, lt=2**62)
    model: Text | None = Field(default=None, max_length=256)
    response_format: Literal["pcm"] = "pcm"
    timestamps: bool = False
    speed: float = Field(default=1.0, ge=0.25, le=4.0)  # the model's own range is checked once it is known
    lora: Text | None = Field(default=None, min_length=1, max_length=64)  # VoxCPM 2: a registered LoRA adapter
    input_format: Literal["text", "ssml"] | None = None  # the session's texts (docs/server.md, "WebSocket protocol")
    lexicon: list[dict] | None = Field(default=None, max_length=MAX_ENTRIES)  # over the saved voice's own


class SessionClosed(Exception):
    """End the session: send ``error`` (if any) and close with ``code``."""

    def __init__(self, code: int, error: APIError | None = None) -> None:
        super().__init__(code)
        self.code, self.error = code, error


def bad_message(message: str, param: str | None = None) -> SessionClosed:
    return SessionClosed(CLOSE_BAD_DATA, APIError(400, message, param=param, code="invalid_message"))


def input_error_close(exc: InputError) -> SessionClosed:
    """The text's fault (1007), naming ``lexicon`` when a lexicon entry is (a phoneme entry for a text model)."""
    param = "lexicon" if str(exc).startswith("lexicon entry") else "text"
    return SessionClosed(CLOSE_BAD_DATA, APIError(400, str(exc), param=param, code="invalid_value"))


def close_code(error: APIError, exc: BaseException | None = None) -> int:
    """1013 busy, 1007 the client's input was bad, 1011 anything else (the engine failed)."""
    if error.status == 429:
        return CLOSE_BUSY
    if error.status >= 500 or (exc is not None and not isinstance(exc, (InputError, APIError))):
        return CLOSE_ERROR
    return CLOSE_BAD_DATA


async def receive_json(ws: WebSocket, timeout: float) -> dict:
    with anyio.fail_after(timeout):
        message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    if message.get("text") is None:
        raise bad_message("send JSON text messages (binary messages are not accepted)")
    try:
        data = json.loads(message["text"])
    except json.JSONDecodeError as exc:
        raise bad_message(f"not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise bad_message("not valid JSON for this protocol: nested too deeply") from exc
    except ValueError as exc:  # an integer literal longer than Python reads (4300 digits)
        raise bad_message(f"not valid JSON for this protocol: {str(exc)[:120]}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise bad_message("every message is a JSON object with a string 'type'", "type")
    return data


async def receive_config(ws: WebSocket, deadlines: Deadlines, model: type[BaseModel]):
    """A session's first message, validated as ``model`` (its ``session.config``): a bad one, or none before the
    idle deadline, ends the session naming the field."""
    try:
        data = await receive_json(ws, deadlines.timeout())
    except TimeoutError:
        raise bad_message(f"no session.config within {deadlines.idle_s:g} s: session closed") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise bad_message(f"the first message must be a valid session.config: {param}: {first.get('msg')}",
                          param) from exc


async def deliver(sending) -> None:
    """Await a send; a connection the client already closed reads as a disconnect, not a server error."""
    try:
        await sending
    except OSError as exc:  # uvicorn's ClientDisconnected and plain socket errors
        raise WebSocketDisconnect(1006) from exc


async def send_error(ws: WebSocket, error: APIError, fatal: bool = True) -> None:
    try:
        await ws.send_json({"type": "error", **error.body(), "fatal": fatal})
    except (RuntimeError, WebSocketDisconnect, OSError):
        pass


class Deadlines:
    """The idle deadline (moved only by text with something in it) and the whole session's."""

    def __init__(self, idle_s: float, session_s: float) -> None:
        now = time.monotonic()
        self.idle_s, self.session_s = idle_s, session_s
        self.idle_at, self.session_at = now + idle_s, now + session_s

    def text_arrived(self) -> None:
        self.idle_at = time.monotonic() + self.idle_s

    def timeout(self, idle: bool = True) -> float:
        return max(0.0, (min(self.idle_at, self.session_at) if idle else self.session_at) - time.monotonic())

    def expired(self) -> SessionClosed:
        if time.monotonic() >= self.session_at - 0.05:
            return bad_message(f"the session lasted {self.session_s:g} s, the longest allowed: session closed")
        return bad_message(f"no text for {self.idle_s:g} s before input.done: session closed")


async def serve_session(ws: WebSocket, path: str, session: Callable[[WebSocket, object], Awaitable[None]]) -> None:
    """Run one WebSocket session at ``path``: refuse a client without the API key (401 before the upgrade where the
    server can, else close 1008), accept, run ``session(ws, state)``, and end it: a ``SessionClosed``'s error and
    code, a disconnect (1001), any other failure as the error it maps to (never taking the server down)."""
    state = ws.app.state.cadenza
    offered = ws.scope.get("subprotocols") or ()
    if not authorized(websocket_authorization(ws.headers.get("authorization"), offered), state.config.api_key):
        state.metrics.count_request(path, CLOSE_POLICY)
        error = APIError(401, "missing or invalid API key (send 'Authorization: Bearer <key>', or from a browser the "
                         "subprotocol 'cadenza.key.<base64url of the key>')",
                         code="invalid_api_key")
        if "websocket.http.response" in ws.scope.get("extensions", {}) and hasattr(ws, "send_denial_response"):
            await ws.send_denial_response(JSONResponse(error.body(), status_code=401))
        else:
            await ws.close(CLOSE_POLICY)
        return
    await ws.accept(subprotocol=WS_PROTOCOL if WS_PROTOCOL in offered else None)  # a browser needs one selected
    code = CLOSE_OK
    try:
        await session(ws, state)
    except SessionClosed as close:
        code = close.code
        if close.error is not None:
            await send_error(ws, close.error)
    except WebSocketDisconnect:
        code = 1001
        state.metrics.count_disconnect()
    except Exception as exc:  # noqa: BLE001 - never let a session take the server down
        error = state.error(exc)
        code = close_code(error, exc)
        await send_error(ws, error)
    state.metrics.count_request(path, code)
    if code != 1001:
        try:
            await ws.close(code)
        except (RuntimeError, WebSocketDisconnect, OSError):
            pass  # already closed by the client
