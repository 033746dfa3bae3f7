"""OpenAI-style error answers: ``{"error": {"message", "type", "param", "code"}}`` with the right HTTP status.

Every failure path of the server ends here: our own ``APIError``, Cadenza's errors (bad text, audio, voice: 400;
a full engine queue: 429 with ``Retry-After``; broken model files: 503 with the detail only in the log), FastAPI's validation errors (422 turned into 400, as OpenAI
answers), Starlette's HTTP errors (404, 405, 413) and, last, unexpected exceptions (500, details only in the log).
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cadenza.errors import (
    AudioError,
    CadenzaError,
    CheckpointError,
    EngineBusyError,
    LoRAInUseError,
    MissingDependencyError,
    RequestCancelledError,
    TextError,
    UnknownLoRAError,
    UnknownSpeakerError,
    VoiceFamilyError,
)
from cadenza.voices.backend import VoiceStoreUnavailableError

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"


class APIError(Exception):
    """An error answer: HTTP ``status`` + OpenAI error fields (+ extra response headers)."""

    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def busy_error(message: str, retry_after_s: int) -> APIError:
    return APIError(429, message, type="rate_limit_error", code="server_busy",
                    headers={"Retry-After": str(retry_after_s)})


def from_exception(exc: BaseException, retry_after_s: int = 1, param: str | None = None) -> APIError:
    """Map any exception to the answer the client gets (unexpected ones become a bare 500)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineBusyError):
        return busy_error(f"the server is busy ({exc}); retry in a moment", retry_after_s)
    if isinstance(exc, (CheckpointError, MissingDependencyError)):
        # The server's model files or installation, never the client's input: a generic answer, the detail (with
        # paths) only in the log.
        log.error("model failure: %s", exc)
        return APIError(503, "the model cannot run on this server right now (see the server log)",
                        type="server_error", code="model_unavailable")
    if isinstance(exc, RequestCancelledError):
        return APIError(503, f"the request was cancelled: {exc}", type="server_error", code="cancelled")
    if isinstance(exc, VoiceStoreUnavailableError):  # the shared voice database is down: another replica, or later
        log.error("voice store: %s", exc)
        return APIError(503, "the voice store is unavailable right now; retry in a moment", type="server_error",
                        code="voice_store_unavailable", headers={"Retry-After": str(retry_after_s)})
    if isinstance(exc, UnknownLoRAError):  # removed between the check of the request and its planning
        return APIError(404, str(exc), param=param or "lora", code="lora_not_found")
    if isinstance(exc, LoRAInUseError):
        return APIError(409, str(exc), param=param or "lora", code="lora_in_use")
    if isinstance(exc, VoiceFamilyError):
        return APIError(400, str(exc), param=param or "voice", code="voice_model_mismatch")
    if isinstance(exc, UnknownSpeakerError):
        return APIError(400, str(exc), param=param or "voice", code="voice_not_found")
    if isinstance(exc, TextError):
        return APIError(400, str(exc), param=param or "input", code="invalid_input")
    if isinstance(exc, AudioError):
        return APIError(400, str(exc), param=param or "audio", code="invalid_audio")
    if isinstance(exc, CadenzaError):
        return APIError(400, str(exc), param=param, code="invalid_value")
    log.error("unexpected error", exc_info=exc)
    return APIError(500, "internal server error (see the server log)", type="server_error", code="internal_error")


_UNION_TAG = re.compile(r"[\[\]()\-]|^[A-Z]")  # 'function-after[...]', 'VoiceId'
_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}


def _json_type(value: object) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _body_error(exc: StarletteHTTPException) -> str | None:
    """What FastAPI's bare "There was an error parsing the body" was about (its cause): JSON nested too deeply, a
    number longer than Python reads, bytes that are not UTF-8. None for any other HTTP error."""
    cause = exc.__cause__
    if exc.status_code != 400 or cause is None:
        return None
    if isinstance(cause, RecursionError):
        return "the request body is not valid JSON for this API: nested too deeply"
    if isinstance(cause, UnicodeDecodeError):
        return f"the request body is not UTF-8 text (byte {cause.start}: {cause.reason})"
    if isinstance(cause, ValueError):  # e.g. an integer literal of more than 4300 digits
        return f"the request body is not valid JSON for this API: {str(cause)[:120]}"
    return None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header") and
           not _UNION_TAG.search(str(p)) and p not in _TYPE_NAMES]  # a field's path, not pydantic's union members
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value").removeprefix("Value error, ")
    if tuple(first.get("loc", ())) == ("body",) and first.get("type") == "missing":
        msg = "the request body is empty: send a JSON object with the request's fields"
    elif tuple(first.get("loc", ())) == ("body",) and first.get("type") == "model_attributes_type":
        msg = f"the request body must be a JSON object, not {_json_type(first.get('input'))}"
    elif first.get("type") == "extra_forbidden":
        msg = "unrecognized request argument"
    elif first.get("type") == "json_invalid":
        msg, param = "the request body is not valid JSON", None
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return (f"{param}: {msg}{more}" if param else f"{msg}{more}"), param


def install_error_handlers(app: FastAPI, retry_after_s: int) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return APIError(400, message, param=param, code="invalid_value").response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        detail = exc.detail if isinstance(exc.detail, str) else "error"
        if (body := _body_error(exc)) is not None:
            return APIError(400, body, code="invalid_json").response()
        return APIError(exc.status_code, detail, code=codes.get(exc.status_code),
                        headers=dict(exc.headers or {})).response()

    @app.exception_handler(CadenzaError)
    async def _cadenza(request: Request, exc: CadenzaError) -> JSONResponse:
        return from_exception(exc, retry_after_s).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc, retry_after_s).response()
