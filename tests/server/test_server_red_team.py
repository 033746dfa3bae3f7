"""Red-team findings against a live server (real uvicorn on loopback, the toy CosyVoice 2): malformed input that
used to give a 500 (or WebSocket 1011) or a vague message, now a specific 4xx (1007) with the server still answering
and nothing stored. The bulk of the hostile-input sweep is in test_server_hardening.py; these are what it missed."""

from __future__ import annotations

import json
import struct

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from cadenza import Cadenza
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, PROMPT_SR, LiveServer, api_error, tone
from toy_model import build_toy_model_dir

TRANSCRIPT = "Just by listening a few minutes a day."
SPEECH = {"model": "tts-1", "input": "Hello there.", "voice": "alice", "response_format": "pcm", "seed": 3}


@pytest.fixture(scope="module")
def server(cv2_dir, tmp_path_factory):
    with Cadenza.from_pretrained(build_toy_model_dir(cv2_dir, tmp_path_factory.mktemp("toy") / "model")) as tts:
        store = VoiceStore(tmp_path_factory.mktemp("voices"))
        store.add("alice", (tone(2.0), PROMPT_SR), TRANSCRIPT, CONSENT)
        config = ServerConfig(max_audio_seconds=60.0, max_inflight_audio_seconds=90.0, ws_idle_timeout_s=5.0)
        with LiveServer(create_app(tts, store, config), config) as live:
            with httpx.Client(base_url=live.url, timeout=120) as client:
                live.client, live.store = client, store
                yield live
        store.close()


def _wav(fmt_tag: int = 1, bits: int = 16, extra: bytes = b"") -> bytes:
    """A 2 s mono 16 kHz WAV whose 'fmt ' chunk says ``fmt_tag`` and ``bits`` (the samples are 16-bit PCM)."""
    data = (tone(2.0) * 32767).astype("<i2").tobytes()
    fmt = struct.pack("<HHIIHH", fmt_tag, 1, PROMPT_SR, PROMPT_SR * 2, 2, bits) + extra
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize("label, upload", [
    ("unknown format tag", _wav(fmt_tag=0x1234)),
    ("0 bits per sample", _wav(bits=0)),
    ("WAVE_FORMAT_EXTENSIBLE with a junk sub-format", _wav(fmt_tag=0xFFFE, extra=b"\x16\x00" + b"\xff" * 22)),
])
def test_a_wav_whose_codec_nothing_decodes_is_a_400_not_a_500(server, label, upload):
    """libsndfile refuses these, and FFmpeg (the fallback for m4a/WebM) opens them with no decoder: its stream had
    no codec context, and reading its rate raised AttributeError, a 500."""
    files = {"audio": ("v.wav", upload, "audio/wav")}
    r = server.client.post("/v1/audio/voices", files=files,
                           data={"name": "odd", "consent": CONSENT, "transcript": TRANSCRIPT})
    err = api_error(r, 400, "audio")
    assert err["code"] == "invalid_audio" and "cannot decode" in err["message"], (label, err)
    assert "odd" not in server.store
    assert server.client.get("/health").status_code == 200


def _raw(client: httpx.Client, body: bytes) -> httpx.Response:
    return client.post("/v1/audio/speech", content=body, headers={"Content-Type": "application/json"})


def test_json_bodies_python_cannot_read_get_a_specific_400(server):
    """FastAPI answered these with a bare "There was an error parsing the body" (no code), and an empty or
    non-object body with "Field required" / "Input should be a valid dictionary ..." naming nothing."""
    c = server.client
    deep = b'{"lexicon": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for body, words in ((deep, "nested too deeply"),
                        (json.dumps(SPEECH).replace('"seed": 3', '"seed": ' + "9" * 5000).encode(), "4300 digits"),
                        (b'{"model": "tts-1", "input": "\xff\xfe"}', "not UTF-8 text (byte 29")):
        err = api_error(_raw(c, body), 400, None)
        assert err["code"] == "invalid_json" and words in err["message"], err
    err = api_error(_raw(c, b""), 400, None)
    assert err["message"] == "the request body is empty: send a JSON object with the request's fields"
    for body, kind in ((b"[]", "an array"), (b'"hi"', "a string"), (b"null", "null"), (b"5", "a number")):
        err = api_error(_raw(c, body), 400, None)
        assert err["message"] == f"the request body must be a JSON object, not {kind}", err
    assert _raw(c, json.dumps(SPEECH).encode()).status_code == 200  # and the server goes on


def _closed(ws) -> tuple[int, list[dict]]:
    """Read to the close: (close code, the JSON messages)."""
    messages = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            message = ws.recv(timeout=60)
            if isinstance(message, str):
                messages.append(json.loads(message))
    return closed.value.rcvd.code, messages


@pytest.mark.parametrize("first, words", [
    ('{"type": "session.config", "x": ' + "[" * 200_000 + "]" * 200_000 + "}", "nested too deeply"),
    ('{"type": "session.config", "seed": ' + "9" * 5000 + "}", "4300 digits"),
])
def test_websocket_json_python_cannot_read_closes_1007_not_1011(server, first, words):
    """json.loads raised RecursionError / ValueError (not JSONDecodeError) for these: the session ended as a server
    error, 1011 "internal server error", with a traceback in the log."""
    url = f"{server.ws_url}/v1/audio/speech/stream"
    with connect(url, open_timeout=30) as ws:
        ws.send(first)
        code, messages = _closed(ws)
    assert code == 1007 and messages[-1]["error"]["code"] == "invalid_message", messages
    assert words in messages[-1]["error"]["message"]
    with connect(url, open_timeout=30) as ws:  # the same after session.config, on input.text
        ws.send(json.dumps({"type": "session.config", "voice": "alice", "seed": 1}))
        assert json.loads(ws.recv(timeout=60))["type"] == "audio.start"
        ws.send(first.replace('"session.config"', '"input.text"'))
        code, messages = _closed(ws)
    assert code == 1007 and words in messages[-1]["error"]["message"], messages
    with connect(url, open_timeout=30) as ws:  # and a well-formed session still speaks
        ws.send(json.dumps({"type": "session.config", "voice": "alice", "seed": 1}))
        ws.send(json.dumps({"type": "input.text", "text": "Hello there."}))
        ws.send(json.dumps({"type": "input.done"}))
        audio = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                message = ws.recv(timeout=60)
                if isinstance(message, bytes):
                    audio.append(message)
    assert closed.value.rcvd.code == 1000 and sum(map(len, audio)) > 0
    assert np.frombuffer(b"".join(audio), "<i2").size > 0


def _multipart(fields: dict[str, bytes], files: dict[str, bytes], boundary: str = "cadenzaBOUNDARY") -> bytes:
    """A multipart/form-data body with text ``fields`` sent as the given bytes (any encoding) and ``files``."""
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n'.encode() + v + b"\r\n"
             for k, v in fields.items()]
    parts += [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"; filename="{k}.wav"\r\n'
              f"Content-Type: application/octet-stream\r\n\r\n".encode() + v + b"\r\n" for k, v in files.items()]
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


def test_a_form_field_in_another_encoding_is_refused_not_stored_garbled(server):
    """Starlette decodes a text field that is not UTF-8 as Latin-1: a consent statement sent in Windows-1252 was
    stored as 'Je consens Ã\xa0 ...'-like mojibake (an audit record nobody can read back) with a 201."""
    consent = "Je consens à l'utilisation de ma voix, signé Renée."
    headers = {"Content-Type": "multipart/form-data; boundary=cadenzaBOUNDARY"}
    body = _multipart({"name": b"renee", "consent": consent.encode("cp1252"), "transcript": TRANSCRIPT.encode()},
                      {"audio": _wav()})
    err = api_error(server.client.post("/v1/audio/voices", content=body, headers=headers), 400, "consent")
    assert err["code"] == "invalid_encoding", err
    assert "form field 'consent' is not valid utf-8: byte 0xe0 at offset 11" in err["message"], err
    assert "renee" not in server.store
    # The same statement in UTF-8 is stored verbatim.
    body = _multipart({"name": b"renee", "consent": consent.encode(), "transcript": TRANSCRIPT.encode()},
                      {"audio": _wav()})
    r = server.client.post("/v1/audio/voices", content=body, headers=headers)
    assert r.status_code == 201, r.text
    assert server.store.get("renee").consent == consent
    server.client.delete("/v1/audio/voices/renee")


@pytest.mark.parametrize("route", ["/v1/audio/voices", "/v1/audio/detect"])
def test_malformed_multipart_gets_the_same_specific_400_on_every_upload_route(server, route):
    """/v1/audio/detect let Starlette answer a form without a boundary: {"detail": ...} without the error object
    (code, param) every other route gives; a truncated upload lost its cut part silently ("missing the audio
    file")."""
    no_boundary = server.client.post(route, content=b"x", headers={"Content-Type": "multipart/form-data"})
    err = api_error(no_boundary, 400, None)
    assert err["code"] == "invalid_form" and "Missing boundary" in err["message"], err
    truncated = _multipart({"name": b"x"}, {"audio": _wav()})[:300]
    r = server.client.post(route, content=truncated,
                           headers={"Content-Type": "multipart/form-data; boundary=cadenzaBOUNDARY"})
    err = api_error(r, 400, None)  # was: "missing the audio file" (the cut part was dropped)
    assert err["code"] == "invalid_form" and "ends before its closing boundary" in err["message"], err
    assert server.client.get("/health").status_code == 200
