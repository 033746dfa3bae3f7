"""Bearer API-key check (constant-time comparison)."""

from __future__ import annotations

import hmac

from fastapi import Request

from cadenza.server.errors import APIError


def authorized(header: str | None, api_key: str | None) -> bool:
    """True when no key is configured, or ``header`` is ``Bearer <api_key>``."""
    if api_key is None:
        return True
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


async def require_api_key(request: Request) -> None:
    """FastAPI dependency: 401 (OpenAI-style) unless the request carries the configured key."""
    if not authorized(request.headers.get("authorization"), request.app.state.cadenza.config.api_key):
        raise APIError(401, "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
