"""``Host`` and ``Origin`` checks: a page on another web site must not be able to use the server.

Without them an open (no key) server on loopback can be driven by any page the user visits: a form POST creates
voices, a WebSocket synthesises (browsers send neither through CORS preflight), and DNS rebinding lets a page read
the answers. So every HTTP request and WebSocket handshake must name an allowed ``Host``, and a request that
carries an ``Origin`` (browsers add it to cross-site POSTs and to every WebSocket) must come from the server's own
origin or an allowed one. Non-browser clients send no ``Origin`` and are unaffected.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from cadenza.server.config import ANY
from cadenza.server.errors import APIError

CLOSE_POLICY = 1008


def host_name(host: str) -> str:
    """``Host`` header value -> lower-case name without port (``[::1]:8000`` -> ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):  # IPv6 literal
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class HostOriginCheck:
    """403 (HTTP) or a refused handshake (WebSocket) for a disallowed ``Host`` or cross-site ``Origin``."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...], origins: tuple[str, ...]) -> None:
        self.app, self.hosts, self.origins = app, hosts, tuple(o.lower() for o in origins)

    def problem(self, scope: Scope) -> APIError | None:
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        host = headers.get(b"host", b"").decode("latin-1")  # latin-1 decodes any byte
        origin = headers.get(b"origin", b"").decode("latin-1").strip().lower()
        if ANY not in self.hosts and host and host_name(host) not in self.hosts:
            return APIError(403, f"host {host[:100]!r} is not served here (allowed: {', '.join(self.hosts)}; "
                            "see --allowed-host)", code="host_not_allowed")
        if origin and ANY not in self.origins:
            scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
            own = f"{scheme}://{host.strip().lower()}"
            if origin != own and origin not in self.origins:
                return APIError(403, f"requests from the web origin {origin[:100]!r} are not allowed (see "
                                "--allowed-origin)", code="origin_not_allowed")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        error = self.problem(scope)
        if error is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await error.response()(scope, receive, send)
        else:
            await receive()  # websocket.connect
            if "websocket.http.response" in scope.get("extensions", {}):
                response = error.response()
                await send({"type": "websocket.http.response.start", "status": response.status_code,
                            "headers": response.raw_headers})
                await send({"type": "websocket.http.response.body", "body": response.body})
            else:
                await send({"type": "websocket.close", "code": CLOSE_POLICY})
