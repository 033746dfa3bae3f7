"""Saved voices over HTTP (real uvicorn + httpx): create/list/get/delete, upload limits, persistence, 429s."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest

from cadenza import Cadenza
from cadenza.engine.scheduler import Scheduler, SchedulerConfig
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, PROMPT_SR, LiveServer, tone, wait_until, wav_bytes
from toy_model import build_toy_model_dir

TEXT = "Hello there, this is a test."
UPLOAD_LIMIT = 200_000


@pytest.fixture(scope="module")
def model_dir(cv2_dir, tmp_path_factory):
    return build_toy_model_dir(cv2_dir, tmp_path_factory.mktemp("toy") / "model")


@pytest.fixture(scope="module")
def tts(model_dir) -> Cadenza:
    with Cadenza.from_pretrained(model_dir) as model:
        yield model


@pytest.fixture(scope="module")
def live(tts, tmp_path_factory):
    directory = tmp_path_factory.mktemp("voices")
    store = VoiceStore(directory)
    with LiveServer(create_app(tts, store, ServerConfig(max_upload_bytes=UPLOAD_LIMIT))) as server:
        server.store, server.directory = store, directory
        with httpx.Client(base_url=server.url, timeout=120) as client:
            server.client = client
            yield server


def _create(client: httpx.Client, name: str, audio: bytes | None = None, filename: str = "v.wav",
            field: str = "audio", **data) -> httpx.Response:
    form = {"name": name, "consent": CONSENT, "transcript": "Just by listening a few minutes a day.", **data}
    form = {k: v for k, v in form.items() if v is not None}
    files = {field: (filename, wav_bytes(tone(1.5)) if audio is None else audio, "application/octet-stream")}
    return client.post("/v1/audio/voices", files=files, data=form)


def _error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param, err
    return err


def _pcm(client: httpx.Client, voice, seed: int = 1) -> bytes:
    r = client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": voice, "seed": seed,
                                              "response_format": "pcm"})
    assert r.status_code == 200, r.text
    return r.content


def test_create_list_get_delete(live):
    c = live.client
    r = _create(c, "Bob Smith")
    assert r.status_code == 201, r.text
    bob = r.json()
    assert bob["id"].startswith("voice_") and bob["name"] == "Bob Smith" and bob["consent"] == CONSENT
    assert bob["duration"] == 1.5 and bob["sample_rate"] == PROMPT_SR and bob["consent_at"] > 0
    xl = _create(c, "carol", transcript=None, field="audio_sample")  # no transcript: cross-lingual voice
    assert xl.status_code == 201 and xl.json()["transcript"] is None
    listed = c.get("/v1/audio/voices").json()
    assert {"id": bob["id"], "name": "Bob Smith", "family": "cosyvoice2"} in listed
    assert all(set(v) == {"id", "name", "family"} for v in listed)
    assert c.get(f"/v1/audio/voices/{bob['id']}").json() == bob
    assert c.get("/v1/audio/voices/bob smith").json()["id"] == bob["id"]  # by name, case-insensitive
    assert len(_pcm(c, "Bob Smith")) > 0 and len(_pcm(c, {"id": xl.json()["id"]})) > 0
    r = c.delete(f"/v1/audio/voices/{bob['id']}")
    assert r.status_code == 200 and r.json() == {"object": "audio.voice.deleted", "id": bob["id"], "deleted": True}
    _error(c.get(f"/v1/audio/voices/{bob['id']}"), 404)
    _error(c.delete(f"/v1/audio/voices/{bob['id']}"), 404)
    _error(c.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "Bob Smith"}), 400, "voice")
    assert not (live.directory / "cache" / bob["id"]).exists()  # its cached features went with it


def test_an_openai_voice_name_needs_a_default_voice_or_a_saved_voice_of_that_name(live):
    """The toy model has no default voice: "alloy" is refused saying how to make one; saved under that name, the
    voice is used as any other (the name wins over the stand-in)."""
    client = live.client
    r = client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "alloy"})
    err = _error(r, 400, "voice")
    assert "OpenAI" in err["message"] and "save a voice named 'alloy'" in err["message"]
    made = _create(client, "alloy")
    assert made.status_code == 201, made.text
    try:
        assert _pcm(client, "alloy") == _pcm(client, made.json()["id"])
    finally:
        client.delete(f"/v1/audio/voices/{made.json()['id']}")


@pytest.mark.parametrize(
    ("kwargs", "status", "param"),
    [({"consent": None}, 400, "consent"), ({"consent": "   "}, 400, "consent"),
     ({"name": "../../etc/passwd"}, 400, "name"), ({"name": ""}, 400, "name"), ({"name": "x" * 65}, 400, "name"),
     ({"transcript": "  "}, 400, "transcript"), ({"transcript": "?!... ,,"}, 400, "transcript"),
     ({"audio": wav_bytes(np.zeros(PROMPT_SR * 2, np.float32))}, 400, "audio"),
     ({"audio": wav_bytes(tone(0.2))}, 400, "audio"), ({"audio": b"RIFF\x00\x00 not audio at all"}, 400, "audio"),
     ({"audio": wav_bytes(tone(31.0, sr=2000), sr=2000)}, 400, "audio"),  # 2 kHz: below the supported rates
     ({"audio": wav_bytes(tone(3.0, sr=48000), sr=48000)}, 413, "audio"),  # 288 kB > 200 kB
     # a misspelt field was silently ignored (a zero-shot voice saved without its transcript, audio not kept)
     ({"transcription": "Just by listening."}, 400, "transcription"), ({"keepaudio": "true"}, 400, "keepaudio")],
)
def test_bad_uploads(live, kwargs, status, param):
    before = live.client.get("/v1/audio/voices").json()
    audio = kwargs.pop("audio", None)
    name = kwargs.pop("name", "dave")
    _error(_create(live.client, name, audio, **kwargs), status, param)
    assert live.client.get("/v1/audio/voices").json() == before  # nothing stored


def test_upload_form_problems(live):
    c = live.client
    # a field given twice: which one counts would be a guess (the last name silently won)
    files = {"audio": ("v.wav", wav_bytes(tone(1.5)), "audio/wav")}
    twice = c.post("/v1/audio/voices", files=files, data={"name": ["t13", "t13b"], "consent": CONSENT})
    assert "'name' is given 2 times" in _error(twice, 400, "name")["message"]
    # Only multipart carries a file; a urlencoded form (what any web page can post) is refused outright.
    assert _error(c.post("/v1/audio/voices", json={"name": "x"}), 415)["code"] == "unsupported_media_type"
    _error(c.post("/v1/audio/voices", data={"name": "x", "consent": CONSENT}), 415)
    _error(c.post("/v1/audio/voices", files={"name": (None, "x"), "consent": (None, CONSENT)}), 400, "audio")
    _error(c.post("/v1/audio/voices", files={"audio": ("a.wav", b"", "audio/wav")},
                  data={"name": "x", "consent": CONSENT}), 400, "audio")
    too_long = wav_bytes(tone(31.0, sr=8000), sr=8000)  # 496 kB on the wire
    assert _error(c.post("/v1/audio/voices", files={"audio": ("a.wav", too_long, "audio/wav")},
                         data={"name": "x", "consent": CONSENT}), 413)["code"] == "request_too_large"

    def chunked():  # no Content-Length: the limit applies while the body streams in
        yield b"--b\r\nContent-Disposition: form-data; name=\"audio\"; filename=\"a.wav\"\r\n\r\n"
        for _ in range(60):
            yield b"\0" * 10_000

    r = c.post("/v1/audio/voices", content=chunked(), headers={"Content-Type": "multipart/form-data; boundary=b"})
    _error(r, 413)
    assert _create(c, "eve").status_code == 201
    assert _error(_create(c, "EVE"), 400, "name")["message"].startswith("a voice named")


def test_other_containers_are_decoded(live):
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="ipod") as container:  # .m4a (AAC), which libsndfile cannot read
        stream = container.add_stream("aac", rate=PROMPT_SR, layout="mono")
        frame = av.AudioFrame.from_ndarray(tone(1.5)[None, :], format="flt", layout="mono")
        frame.sample_rate = PROMPT_SR
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    r = _create(live.client, "m4a voice", buf.getvalue(), filename="v.m4a")
    assert r.status_code == 201, r.text
    assert abs(r.json()["duration"] - 1.5) <= 0.15  # + AAC priming and padding
    playlist = b"#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nfile:///etc/passwd\n#EXT-X-ENDLIST\n"
    _error(_create(live.client, "playlist", playlist), 400, "audio")  # never handed to a probing demuxer


def test_names_never_reach_the_filesystem(live):
    c = live.client
    for path in ("..%2F..%2Fetc%2Fpasswd", "voice_..%2F..%2F..%2F..%2F..%2F..%2Fetc", "%2Fetc%2Fpasswd"):
        assert c.get(f"/v1/audio/voices/{path}").status_code == 404
        assert c.delete(f"/v1/audio/voices/{path}").status_code == 404
    names = {p.relative_to(live.directory).parts[0] for p in live.directory.rglob("*")}
    assert names <= {"voices.sqlite3", "voices.sqlite3-wal", "voices.sqlite3-shm", "cache"}
    ids = {v["id"] for v in c.get("/v1/audio/voices").json()}
    cache = live.directory / "cache"
    assert not cache.exists() or {p.name for p in cache.iterdir()} <= ids


def test_voices_persist_across_a_restart(tts, model_dir, tmp_path):
    directory = tmp_path / "voices"
    with LiveServer(create_app(tts, VoiceStore(directory))) as first, httpx.Client(base_url=first.url,
                                                                                 timeout=120) as c:
        voice = _create(c, "frank").json()
        before = _pcm(c, "frank", seed=5)
    # A new process would start from scratch: new model object, new store object, same directory.
    with Cadenza.from_pretrained(model_dir) as again, LiveServer(create_app(again, VoiceStore(directory))) as second:
        with httpx.Client(base_url=second.url, timeout=120) as c:
            assert c.get("/v1/audio/voices").json() == [{"id": voice["id"], "name": "frank", "family": "cosyvoice2"}]
            assert c.get(f"/v1/audio/voices/{voice['id']}").json() == voice
            # Features computed at creation are pinned with the voice (its recording is not kept by default) and read
            # back from the store now: the same audio.
            assert voice["audio_kept"] is False
            assert _pcm(c, "frank", seed=5) == before


def test_busy_answers_429(model_dir, tmp_path):
    """A tiny engine (1 active, 0 queued) and a server admitting 1 request: both limits give 429 + Retry-After."""
    from websockets.sync.client import connect

    with Cadenza.from_pretrained(model_dir) as small:
        eng = small.engine
        eng.scheduler = Scheduler(eng.model, eng.schedule, SchedulerConfig(max_active=1, max_queued=0))
        store = VoiceStore(tmp_path / "voices")
        store.add("gina", (tone(1.5), PROMPT_SR), "Just by listening.", CONSENT)
        config = ServerConfig(max_concurrency=1, retry_after_s=3)
        with LiveServer(create_app(small, store, config)) as server, httpx.Client(base_url=server.url,
                                                                                  timeout=120) as c:
            body = {"model": "tts-1", "input": TEXT, "voice": "gina", "response_format": "pcm"}
            # 1. The engine is full (a bi-streaming request waiting for text holds its only slot).
            held = eng.stream_bistream(eng.build_bistream(voice=None, mode="default_voice"))
            r = c.post("/v1/audio/speech", json=body)
            err = _error(r, 429)
            assert r.headers["retry-after"] == "3" and "busy" in err["message"]
            held.cancel()
            assert wait_until(lambda: eng.scheduler.load == (0, 0))
            # 2. A WebSocket session that has sent only its config and whitespace holds nothing ...
            with connect(f"{server.ws_url}/v1/audio/speech/stream") as ws:
                ws.send('{"type": "session.config", "voice": "gina"}')
                assert '"audio.start"' in ws.recv(timeout=60)
                ws.send('{"type": "input.text", "text": "  "}')
                assert c.post("/v1/audio/speech", json=body).status_code == 200
                # ... but once it has text to speak, it holds the one admission: the server is full.
                ws.send('{"type": "input.text", "text": "Hello there "}')
                assert wait_until(lambda: c.get("/health").json()["inflight"] == 1)
                r = c.post("/v1/audio/speech", json=body)
                assert "in flight" in _error(r, 429)["message"] and r.headers["retry-after"] == "3"
            assert wait_until(lambda: eng.scheduler.load == (0, 0) and c.get("/health").json()["inflight"] == 0)
            assert c.post("/v1/audio/speech", json=body).status_code == 200  # and it recovers


_SERVE = """
import argparse, sys
from cadenza.cli.serve import add_serve_parser, run_serve
parser = argparse.ArgumentParser(prog="cadenza")
add_serve_parser(parser.add_subparsers(dest="command", required=True))
run_serve(parser.parse_args(sys.argv[1:]))
"""


def test_cadenza_serve_command(model_dir, tmp_path):
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "CADENZA_API_KEY": "cli-key-0123456"}
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, "serve", "--model", str(model_dir), "--port", str(port),
                             "--voices-dir", str(tmp_path / "voices"), "--log-level", "warning",
                             "--max-active", "3", "--max-queued", "5", "--vocoder-workers", "1", "--threads", "1",
                             "--first-audio-pause", "contended", "--no-stream-batching"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None

        assert wait_until(up, timeout=60) and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
        health = httpx.get(f"{url}/health").json()
        # the engine settings given on the command line
        assert (health["max_active"], health["max_queued"], health["first_audio_pause"],
                health["batch_streams"]) == (3, 5, "contended", False)
        assert httpx.get(f"{url}/v1/audio/voices").status_code == 401
        auth = {"Authorization": "Bearer cli-key-0123456"}
        assert httpx.get(f"{url}/v1/audio/voices", headers=auth).json() == []
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert (tmp_path / "voices" / "voices.sqlite3").is_file() and "serving" in err
