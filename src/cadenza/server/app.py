"""``create_app(tts, voices, config)``: the FastAPI application (OpenAI speech, voices, WebSocket, metrics).

Endpoints: ``POST /v1/audio/speech``, ``POST /v1/audio/voice-conversion``, ``WS /v1/audio/speech/stream``, ``POST/GET /v1/audio/voices``,
``GET/DELETE /v1/audio/voices/{id}``, ``GET /v1/models``, ``GET /metrics``, ``GET /openapi.json`` and ``GET /docs``
(all behind the API key when one is configured), ``GET /health`` (open, for load balancers) and the web
playground ``GET /`` (open: a static page, see playground/). ASGI middlewares
wrap everything: the ``Host``/``Origin`` check (origin.py), a request-body limit (413 before a big upload lands in
memory) and request counting for ``/metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cadenza.api.protocol import SpeechModel
from cadenza.server import (
    admin,
    live_conversion,
    lora_admin,
    markup_api,
    openai_speech,
    playground,
    provenance,
    voice_conversion,
    voices_api,
    websocket,
)
from cadenza.server.auth import require_api_key
from cadenza.server.config import ServerConfig, model_name_of, valid_model_name
from cadenza.server.errors import APIError, install_error_handlers
from cadenza.server.metrics import CONTENT_TYPE, Metrics
from cadenza.server.origin import HostOriginCheck
from cadenza.server.state import ServerState
from cadenza.voices import VoiceStore

FORM_OVERHEAD_BYTES = 256 * 1024  # multipart boundaries + name/transcript/consent fields around the audio file


class BodyLimit:
    """413 for request bodies over ``max_bytes``: at once from ``Content-Length``, else while they stream in."""

    def __init__(self, app: ASGIApp, max_bytes: int, larger: Mapping[str, int] | None = None) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.larger = dict(larger or {})  # path -> its own limit (LoRA uploads)

    def _error(self, limit: int) -> APIError:
        return APIError(413, f"request body larger than {limit} bytes", code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", ())).get(b"content-length")
        try:
            declared = int(length) if length is not None else None
        except ValueError:
            declared = None
        limit = self.larger.get(scope.get("path", ""), self.max_bytes)
        if declared is not None and declared > limit:
            await self._error(limit).response()(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, self._error(limit).message)  # FastAPI re-raises HTTPException as is
            return message

        await self.app(scope, limited, send)


class CountRequests:
    """Counts HTTP answers by route template and status for ``/metrics`` (WebSockets count themselves)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                self.metrics.count_request(getattr(route, "path", "other"), message["status"])
            await send(message)

        await self.app(scope, receive, counting)


def _info_router(started: float) -> tuple[APIRouter, APIRouter]:
    protected, public = APIRouter(), APIRouter()

    @protected.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        state: ServerState = request.app.state.cadenza
        data = []
        for m in state.models.values():  # each LoRA adapter after its model, as "<model>:<adapter>"
            data += [m.describe(int(started)), *(m.describe_lora(a, int(started)) for a in m.loras)]
        return JSONResponse({"object": "list", "data": data})

    @protected.get("/v1/models/{name}")
    async def model(name: str, request: Request) -> JSONResponse:
        state: ServerState = request.app.state.cadenza
        if ":" in name:
            served, lora = state.route(name)
            return JSONResponse(served.describe_lora(lora, int(started)))
        if name not in state.models:
            raise APIError(404, f"model {name[:80]!r} is not served here; served: {', '.join(state.models)}",
                           param="model", code="model_not_found")
        return JSONResponse(state.models[name].describe(int(started)))

    @protected.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        state: ServerState = request.app.state.cadenza
        active, queued = state.load()
        text = state.metrics.render(active, queued, state.admission.inflight)
        return PlainTextResponse(text, media_type=CONTENT_TYPE)

    @protected.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(request.app.openapi())

    @protected.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=request.app.title)

    @public.api_route("/health", methods=["GET", "HEAD"])  # HEAD: what some load balancers probe with
    async def health(request: Request) -> JSONResponse:
        state: ServerState = request.app.state.cadenza
        active, queued = state.load()
        default = state.default
        if state.model_failure is not None:  # a load balancer should stop sending work here
            return JSONResponse({"status": "unavailable", "model": default.name,
                                 "reason": "the model's files failed at run time (see the server log)"},
                                status_code=503)
        models = []
        for served in state.models.values():
            m_active, m_queued = served.tts.load
            limits = served.tts.limits
            models.append({"id": served.name, "family": served.capabilities.family,
                           "sample_rate": served.sample_rate, "active": m_active, "queued": m_queued,
                           "max_active": limits.max_active, "max_queued": limits.max_queued})
        limits = default.tts.limits
        return JSONResponse({"status": "ok", "model": default.name, "sample_rate": default.sample_rate,
                             "active": active, "queued": queued, "inflight": state.admission.inflight,
                             "max_active": limits.max_active, "max_queued": limits.max_queued,
                             "first_audio_pause": limits.first_audio_pause, "batch_streams": limits.batch_streams,
                             "models": models})

    return protected, public


def create_app(models: SpeechModel | Mapping[str, SpeechModel], voices: VoiceStore,
               config: ServerConfig | None = None) -> FastAPI:
    """The server for ``models`` with saved voices in ``voices``.

    ``models``: one model (any family: ``cadenza.load``'s result), served as ``config.model_name`` (default: its
    folder's name), or ``{name: model}`` in order, the first being the default. The caller owns the models and ``voices`` (close them
    after the server stops).
    """
    from cadenza import __version__

    config = config or ServerConfig()
    # FastAPI's own /docs, /redoc and /openapi.json would be open to anyone: ours sit behind the key.
    app = FastAPI(title="Cadenza speech server", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None)
    if not isinstance(models, Mapping):
        models = {config.model_name or model_name_of(models.directory): models}
    for name in models:
        if not valid_model_name(name):
            raise ValueError(f"bad model name {name!r}: 1-64 letters, digits, '.', '_' or '-'")
    state = ServerState.create(models, voices, config)
    app.state.cadenza = state
    install_error_handlers(app, config.retry_after_s)
    auth = [Depends(require_api_key)]
    protected, public = _info_router(time.time())
    app.include_router(openai_speech.router, dependencies=auth)
    app.include_router(voices_api.router, dependencies=auth)
    app.include_router(voice_conversion.router, dependencies=auth)
    app.include_router(markup_api.router, dependencies=auth)
    app.include_router(provenance.router, dependencies=auth)
    app.include_router(protected, dependencies=auth)
    app.include_router(public)
    app.include_router(playground.router)  # the page at / is open: it holds nothing, its requests carry the key
    app.include_router(admin.router)  # the admin key, not the API key
    app.include_router(lora_admin.router)  # the admin key too
    app.include_router(websocket.router)  # checks the key itself (before accepting the connection)
    app.include_router(live_conversion.router)  # so does this one
    app.add_middleware(BodyLimit, max_bytes=config.max_upload_bytes + FORM_OVERHEAD_BYTES,
                       larger={lora_admin.PATH: config.max_lora_bytes + lora_admin.MAX_CONFIG_BYTES
                               + FORM_OVERHEAD_BYTES})
    app.add_middleware(CountRequests, metrics=state.metrics)
    app.add_middleware(HostOriginCheck, hosts=config.hosts, origins=config.allowed_origins)  # outermost: first
    return app
