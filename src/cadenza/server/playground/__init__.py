"""The web playground: one static page at ``/`` (``index.html``, ``playground/app.js``, ``playground/style.css``).

The files ship in the package and are served as they are (no build step, nothing from other sites). The page is
open without the API key because it holds nothing: every request it makes carries the key the user types in (the
``Authorization`` header, or a WebSocket subprotocol, see ``cadenza.server.auth``). A strict Content-Security-Policy
keeps it to this server: scripts, styles and connections from its own origin only.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from cadenza.server.errors import APIError

router = APIRouter(include_in_schema=False)

# name in the URL -> (file in this package, media type); a fixed map, so no path is ever built from a request.
ASSETS = {
    "app.js": ("app.js", "text/javascript; charset=utf-8"),
    "style.css": ("style.css", "text/css; charset=utf-8"),
}
# 'self' covers ws:/wss: to the same host and port (CSP 3). blob: plays and saves what the page downloaded or
# recorded; data: is the empty favicon (no /favicon.ico request, no 404 in the console).
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "media-src 'self' blob:; form-action 'none'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}


@cache
def _read(name: str) -> bytes:
    return files(__name__).joinpath(name).read_bytes()


@router.get("/")
async def page() -> Response:
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/playground/{name}")
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise APIError(404, f"no playground file {name[:80]!r}", code="not_found")
    filename, media_type = ASSETS[name]
    return Response(_read(filename), media_type=media_type, headers=HEADERS)
