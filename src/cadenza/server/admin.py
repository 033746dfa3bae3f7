"""Operator endpoints (behind the admin key, not the API key): takedown of a voice and the audit log.

``POST /v1/admin/voices/{id or name}/takedown`` with ``{"reason": "..."}`` deletes the voice and every cached
feature, and refuses its recording from then on (``VoiceStore.takedown``); ``GET /v1/admin/audit`` lists the audit
log (``?voice=<id>`` for one voice, ``?limit=``). The same operations exist offline: ``cadenza voices``.
"""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from cadenza.errors import UnknownSpeakerError
from cadenza.server.auth import require_admin_key
from cadenza.server.errors import APIError
from cadenza.server.fields import STRICT, Text, require_json
from cadenza.server.state import ServerState

router = APIRouter(dependencies=[Depends(require_admin_key)])


class Takedown(BaseModel):
    model_config = STRICT
    reason: Text = Field(min_length=1, max_length=1000)


@router.post("/v1/admin/voices/{voice}/takedown", dependencies=[Depends(require_json)])
async def takedown(voice: str, body: Takedown, request: Request) -> JSONResponse:
    state: ServerState = request.app.state.cadenza

    def run() -> dict:
        try:
            removed = state.voices.takedown(voice, body.reason)
        except UnknownSpeakerError as exc:
            raise APIError(404, f"no saved voice {voice[:80]!r}", param="voice_id", code="voice_not_found") from exc
        for served in state.models.values():
            served.prompts.forget(removed["id"])
        return removed

    try:
        removed = await anyio.to_thread.run_sync(run, limiter=state.limiter)
    except APIError:
        raise
    except Exception as exc:
        raise state.error(exc, param="reason") from exc
    return JSONResponse({"object": "audio.voice.takedown", **removed})


@router.get("/v1/admin/audit")
async def audit_log(request: Request, voice: str | None = Query(default=None, max_length=128),
                    limit: int = Query(default=1000, ge=1, le=100_000)) -> JSONResponse:
    state: ServerState = request.app.state.cadenza
    events = await anyio.to_thread.run_sync(state.voices.audit_log, voice, limit, limiter=state.limiter)
    return JSONResponse({"object": "list", "data": [e.to_dict() for e in events]})
