"""Bearer API-key check (constant-time comparison), from the ``Authorization`` header or, for browser WebSockets,
a subprotocol."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Sequence

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


# Browsers cannot set headers on a WebSocket, only subprotocols: a page offers ``[WS_PROTOCOL, WS_KEY_PREFIX +
# base64url(key)]`` and the server selects ``WS_PROTOCOL``, so the key is never echoed back. Not a query parameter:
# URLs end up in access logs and browser history.
WS_PROTOCOL = "cadenza"
WS_KEY_PREFIX = "cadenza.key."
URLSAFE_B64 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def websocket_authorization(header: str | None, subprotocols: Sequence[str]) -> str | None:
    """The ``Authorization`` header of a WebSocket handshake, else ``Bearer <key>`` from a ``cadenza.key.<base64url
    of the UTF-8 key, unpadded>`` subprotocol; ``None`` when neither is there (or the subprotocol is malformed)."""
    if header:
        return header
    for protocol in subprotocols:
        if protocol.startswith(WS_KEY_PREFIX):
            encoded = protocol[len(WS_KEY_PREFIX):]
            if not encoded or not set(encoded) <= URLSAFE_B64:
                return None  # urlsafe_b64decode would skip foreign characters, not refuse them
            try:
                key = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
            except (binascii.Error, ValueError):
                return None
            return f"Bearer {key}"
    return None


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
