"""The HTTP/WebSocket speech server (``pip install 'cadenza[server]'``): an OpenAI-compatible ``/v1/audio/speech``
with streaming, saved voices, bi-streaming over WebSocket and Prometheus metrics. See docs/server.md."""

from cadenza.errors import MissingDependencyError

try:
    import av  # noqa: F401
    import fastapi  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise MissingDependencyError(
        f"the server needs the 'server' extra ({_exc.name} is missing): pip install 'cadenza[server]'"
    ) from _exc

from cadenza.server.app import create_app  # noqa: E402
from cadenza.server.config import ServerConfig  # noqa: E402

__all__ = ["ServerConfig", "create_app"]
