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


async def require_admin_key(request: Request) -> None:
    """FastAPI dependency of the operator's endpoints: 403 when no admin key is configured (they are off), 401
    unless the request carries it."""
    admin_key = request.app.state.cadenza.config.admin_key
    if admin_key is None:
        raise APIError(403, "operator endpoints are off: start the server with an admin key (--admin-key or "
                       "$CADENZA_ADMIN_KEY), or use `cadenza voices` on the voice folder", code="admin_disabled")
    if not authorized(request.headers.get("authorization"), admin_key):
        raise APIError(401, "missing or invalid admin key: send the header 'Authorization: Bearer <admin key>'",
                       code="invalid_admin_key", headers={"WWW-Authenticate": "Bearer"})
