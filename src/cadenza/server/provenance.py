"""``POST /v1/audio/detect``: does an audio file carry this server's provenance watermark (docs/provenance.md)?

Multipart form with the file in ``audio``; answers ``{"found", "payload" (hex or null), "score", "payload_matches"}``
where ``payload_matches`` names the served models whose outputs carry that payload. Uses the key the models mark
with (Cadenza's public key when marking is off).
"""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from cadenza.audio.io import load_audio
from cadenza.provenance import Watermark
from cadenza.provenance.keys import DEFAULT_KEY
from cadenza.server.multipart import read_audio_file, read_form
from cadenza.server.state import ServerState

router = APIRouter()
MAX_DETECT_SECONDS = 600.0


@router.post("/v1/audio/detect")
async def detect(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.cadenza
    form = await read_form(request, fields=("audio",), max_files=1,
                           not_multipart="send the audio as multipart/form-data (file field 'audio')")
    try:
        data = await read_audio_file(form, ("audio",), state.config.max_upload_bytes)
    finally:
        await form.close()
    marks = {name: served.tts.mark for name, served in state.models.items()}
    watermark = next((m.watermark for m in marks.values() if m.watermark is not None), None)
    if watermark is None:
        watermark = Watermark(DEFAULT_KEY, state.default.sample_rate)

    def run():
        # load_audio: the decode path of every audio reader, so detect reads what the voice endpoints read (and the
        # server's own outputs: a streamed FLAC that states no length, AAC).
        audio = load_audio(data, 16000, state.config.max_upload_bytes, max_seconds=MAX_DETECT_SECONDS).numpy()
        return watermark.detect(audio, 16000)

    try:
        found = await anyio.to_thread.run_sync(run, limiter=state.limiter)
    except Exception as exc:
        raise state.error(exc, param="audio") from exc
    matches = [name for name, m in marks.items() if found.payload is not None and m.payload == found.payload]
    return JSONResponse({**found.to_json(), "payload_matches": matches})
