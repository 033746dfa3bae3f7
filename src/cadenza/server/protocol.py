"""How ``cadenza serve`` runs the app under uvicorn: bounded connections and a deadline for request headers.

uvicorn has no timeout for reading a request's headers: a client that sends half a request line and waits holds
its connection (and a file descriptor) forever, and a few hundred such clients exhaust the server. Our HTTP protocol
closes a connection whose headers are not complete within ``header_timeout_s`` of its opening, or of the end of the
previous response on a kept-alive connection. ``max_connections`` (uvicorn's ``limit_concurrency``) bounds the rest.
"""

from __future__ import annotations

import asyncio

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from cadenza.server.config import ServerConfig

WS_MAX_MESSAGE_BYTES = 1 * 2**20  # WebSocket messages carry text pieces and small JSON only


class HeaderDeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol + a deadline for the request headers (``header_timeout_s``)."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._arm_header_deadline()

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_deadline_passed)

    def _disarm_header_deadline(self) -> None:
        if getattr(self, "_header_deadline", None) is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_deadline_passed(self) -> None:
        self._header_deadline = None
        # Still waiting for (the rest of) a request line and headers: give up on this client.
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.debug("closing a connection that sent no complete request headers in %.0f s",
                              self.header_timeout_s)
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # the headers are in: the app's own limits apply now
            self._disarm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_deadline()  # the next request on a kept-alive connection gets the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)


def protocol_class(header_timeout_s: float) -> type[H11Protocol]:
    return type("CadenzaH11Protocol", (HeaderDeadlineH11Protocol,), {"header_timeout_s": float(header_timeout_s)})


def uvicorn_config(app, config: ServerConfig, **kwargs) -> uvicorn.Config:
    """The uvicorn settings the server runs with (``kwargs``: host, port, log_level, ... for ``uvicorn.Config``)."""
    kwargs.setdefault("ws_max_size", WS_MAX_MESSAGE_BYTES)
    kwargs.setdefault("timeout_graceful_shutdown", 10)
    return uvicorn.Config(app, http=protocol_class(config.header_timeout_s), limit_concurrency=config.max_connections,
                          **kwargs)


__all__ = ["HeaderDeadlineH11Protocol", "protocol_class", "uvicorn_config"]
