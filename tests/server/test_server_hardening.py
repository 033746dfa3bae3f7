"""The server under hostile use (real uvicorn on loopback): bounded work, atomic voices, Host/Origin checks, model
failures, strict bodies, header deadline. docs/server.md "Limits and security" lists every bound tested here."""

from __future__ import annotations

import io
import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from cadenza.errors import CheckpointError
from cadenza.server import ServerConfig, create_app
from cadenza.server.engine_stream import Admission
from cadenza.server.errors import APIError
from cadenza.server.origin import HostOriginCheck, host_name
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, PROMPT_SR, LiveServer, api_error, tone, wait_until, wav_bytes

KEY = "hardening-key-0123"
TRANSCRIPT = "Just by listening a few minutes a day."
SPEECH = {"model": "tts-1", "input": "Hello there.", "voice": "alice", "response_format": "pcm", "seed": 3}


def _server(tts, directory, **settings) -> LiveServer:
    store = VoiceStore(directory)
    if "alice" not in store:
        store.add("alice", (tone(2.0), PROMPT_SR), TRANSCRIPT, CONSENT)
    config = ServerConfig(**settings)
    server = LiveServer(create_app(tts, store, config), config)
    server.store, server.config = store, config
    return server


@pytest.fixture(scope="module")
def open_server(tts, tmp_path_factory):
    """No API key (the case the Host/Origin checks protect), small work limits, a 1 s header deadline."""
    with _server(tts, tmp_path_factory.mktemp("voices"), max_audio_seconds=60.0, max_inflight_audio_seconds=90.0,
                 header_timeout_s=1.0, ws_idle_timeout_s=5.0) as server:
        server.state = server.server.config.app.state.cadenza
        with httpx.Client(base_url=server.url, timeout=120) as client:
            server.client = client
            yield server


def _create(client: httpx.Client, name: str, audio: bytes | None = None, **fields) -> httpx.Response:
    files = {"audio": ("v.wav", audio if audio is not None else wav_bytes(tone(2.0)), "audio/wav")}
    return client.post("/v1/audio/voices", files=files, data={"name": name, "consent": CONSENT, **fields})


# -- 2. the work one request can cause ------------------------------------------------------------------------------
def test_text_that_reads_out_long_is_refused_before_any_work(tts, open_server):
    c, sched = open_server.client, tts.engine.scheduler
    steps = sched.state.lm_steps
    started = time.perf_counter()
    err = api_error(c.post("/v1/audio/speech", json={**SPEECH, "input": "9" * 4000}), 400, "input")
    assert err["code"] == "string_above_max_length" and "reads out to 19" in err["message"]
    err = api_error(c.post("/v1/audio/speech", json={**SPEECH, "input": "Hello there. " * 200}), 400, "input")
    assert err["code"] == "audio_above_max_duration" and "about 167 s" in err["message"]
    assert time.perf_counter() - started < 10 and sched.state.lm_steps == steps  # no LM step was run for them
    assert open_server.state.admission.inflight == 0 and open_server.state.admission.work == 0


def test_the_audio_of_one_request_is_cut_at_the_limit(tts, tmp_path):
    with _server(tts, tmp_path / "voices", max_audio_seconds=0.5, max_inflight_audio_seconds=10.0) as server:
        # "Hi." is estimated at 0.17 s; the toy (random) LM runs on to its length limit: the server cuts it.
        r = httpx.post(f"{server.url}/v1/audio/speech", json={**SPEECH, "input": "Hi."}, timeout=120)
        assert r.status_code == 200
        samples = np.frombuffer(r.content, dtype="<i2").size
        full = tts.synthesize("Hi.", prompt_wav=(tone(2.0), PROMPT_SR), prompt_text=TRANSCRIPT,
                              seed=3).samples.size
        assert samples == 12_000 < full  # exactly max_audio_seconds at 24 kHz
        # and the answer says so where it can: a header on a whole answer, a flag on the SSE done event
        whole = httpx.post(f"{server.url}/v1/audio/speech", json={**SPEECH, "input": "Hi.", "stream": False},
                           timeout=120)
        assert whole.status_code == 200 and whole.headers["X-Audio-Truncated"] == "true"
        assert np.frombuffer(whole.content, dtype="<i2").size == 12_000
        sse = httpx.post(f"{server.url}/v1/audio/speech", json={**SPEECH, "input": "Hi.", "stream_format": "sse"},
                         timeout=120)
        done = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")][-1]
        assert done["type"] == "speech.audio.done" and done["truncated"] is True


def test_the_estimate_counts_the_speaking_rate(tts, open_server):
    """Text that fits the limit at speed 1 but not at half speed is refused before any work (it was made and cut at
    the limit with a 200)."""
    c, sched = open_server.client, tts.engine.scheduler
    text = "Hello there. " * 60  # about 50 s at speed 1; the limit is 60 s
    steps = sched.state.lm_steps
    err = api_error(c.post("/v1/audio/speech", json={**SPEECH, "input": text, "speed": 0.5}), 400, "input")
    assert err["code"] == "audio_above_max_duration" and "at speed 0.5" in err["message"]
    assert sched.state.lm_steps == steps


def test_admission_counts_work_not_only_requests():
    admission = Admission(limit=8, retry_after_s=2, max_work=90.0)
    first = admission.acquire(50.0)
    with pytest.raises(APIError) as busy:
        admission.acquire(50.0)
    assert busy.value.status == 429 and busy.value.headers["Retry-After"] == "2"
    assert "50 s of audio in the making (limit 90 s)" in busy.value.message
    small = admission.acquire(1.0)
    with pytest.raises(APIError):
        small.grow(45.0)  # a planned request that turns out big is refused too
    assert admission.work == 51.0
    first.release()
    first.release()  # idempotent
    small.grow(45.0)
    assert (admission.inflight, admission.work) == (1, 46.0)
    small.release()
    assert (admission.inflight, admission.work) == (0, 0.0)


def test_a_long_websocket_text_fills_the_work_budget(open_server):
    """A session holding ~50 s of text leaves no room for a 45 s request (budget 90 s) but does for a short one."""
    with connect(f"{open_server.ws_url}/v1/audio/speech/stream", open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alice", "seed": 1}))
        assert json.loads(ws.recv(timeout=60))["type"] == "audio.start"
        ws.send(json.dumps({"type": "input.text", "text": "word " * 150}))  # 600 letters: 50 s
        assert wait_until(lambda: open_server.state.admission.work >= 49.0)
        long = {**SPEECH, "input": "Hello there, how are you. " * 26}  # 45 s
        err = api_error(open_server.client.post("/v1/audio/speech", json=long), 429)
        assert "of audio in the making" in err["message"]
        assert open_server.client.post("/v1/audio/speech", json=SPEECH).status_code == 200
    assert wait_until(lambda: open_server.state.admission.work == 0)


def test_a_websocket_at_half_speed_counts_twice_the_seconds(open_server):
    """The same ~50 s of text that a session at speed 1 may speak (the limit is 60 s) is refused at speed 0.5, where
    it would make ~100 s and be cut at the limit."""
    with connect(f"{open_server.ws_url}/v1/audio/speech/stream", open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alice", "seed": 1, "speed": 0.5}))
        assert json.loads(ws.recv(timeout=60))["type"] == "audio.start"
        ws.send(json.dumps({"type": "input.text", "text": "word " * 150}))
        error = json.loads(ws.recv(timeout=60))
        assert error["type"] == "error" and error["error"]["code"] == "audio_above_max_duration", error
    assert wait_until(lambda: open_server.state.admission.work == 0)


# -- 1. decompression bombs at the upload ---------------------------------------------------------------------------
def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_a_voice_upload_bomb_is_refused_without_decoding_it(open_server):
    buf = io.BytesIO()
    sf.write(buf, np.zeros(30 * 60 * 48_000, np.int16), 48_000, format="FLAC", subtype="PCM_16")
    bomb = buf.getvalue()
    assert len(bomb) < 1_000_000  # 30 minutes of silence in well under a megabyte
    peak, stop = [_rss_mb()], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak.append(_rss_mb())
            time.sleep(0.005)

    base = _rss_mb()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        err = api_error(_create(open_server.client, "bomb", bomb), 400, "audio")
    finally:
        stop.set()
        sampler.join()
    assert "too long" in err["message"] and "1800" in err["message"]
    assert max(peak) - base < 150, f"RSS grew by {max(peak) - base:.0f} MB"  # decoding it all takes ~350-900 MB
    assert "bomb" not in open_server.store


# -- 4. voices are created atomically -------------------------------------------------------------------------------
def test_a_voice_the_model_cannot_use_leaves_nothing_behind(open_server, monkeypatch):
    c, store = open_server.client, open_server.store
    before = c.get("/v1/audio/voices").json()
    api_error(_create(c, "quiet", transcript="?!"), 400, "transcript")

    def crash(*args, **kwargs):
        raise RuntimeError("the feature extractor crashed")

    monkeypatch.setattr(open_server.state.default.tts, "voice_from_audio", crash)
    api_error(_create(c, "crashy", transcript=TRANSCRIPT), 500)
    monkeypatch.undo()
    assert c.get("/v1/audio/voices").json() == before
    assert [r.name for r in store.list()] == [v["name"] for v in before]
    assert {p.name for p in (store.directory / "cache").glob("*")} <= {r.id for r in store.list()}  # no orphans
    created = _create(c, "crashy", transcript=TRANSCRIPT)  # the name was never taken
    assert created.status_code == 201, created.text
    # Created = usable at once, with its features pinned in the store.
    assert store.cached_prompt(created.json()["id"], open_server.state.default.prompts.model_key) is not None
    assert c.post("/v1/audio/speech", json={**SPEECH, "voice": "crashy"}).status_code == 200


def test_names_that_differ_only_in_case_are_one_name_in_every_script(open_server):
    c = open_server.client
    assert _create(c, "Élodie").status_code == 201
    assert "already exists" in api_error(_create(c, "élodie"), 400, "name")["message"]
    assert _create(c, "Straße").status_code == 201
    api_error(_create(c, "STRASSE"), 400, "name")
    assert c.get("/v1/audio/voices/ÉLODIE").json()["name"] == "Élodie"


def test_schema_1_stores_get_case_folded_names(tmp_path):
    import sqlite3

    store = VoiceStore(tmp_path)
    store.add("Zoë", (tone(1.0), PROMPT_SR), None, CONSENT)
    store.close()
    with sqlite3.connect(tmp_path / "voices.sqlite3") as db:  # as schema 1 left it
        db.execute("DROP INDEX IF EXISTS voices_name_key")
        db.execute("UPDATE voices SET name_key = NULL")
        db.execute("PRAGMA user_version = 1")
    store = VoiceStore(tmp_path)
    assert store.get("ZOË").name == "Zoë"
    with pytest.raises(Exception, match="already exists"):
        store.add("zoë", (tone(1.0), PROMPT_SR), None, CONSENT)


# -- 5. a broken model is the server's fault, not the client's ------------------------------------------------------
def test_a_model_file_failing_at_run_time_is_a_503_and_turns_health_red(tts, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise CheckpointError(f"{tmp_path}/campplus.onnx: truncated protobuf")

    with _server(tts, tmp_path / "voices") as server, httpx.Client(base_url=server.url, timeout=120) as c:
        assert c.get("/health").status_code == 200
        head = c.head("/health")  # what some load balancers probe with (was 405)
        assert head.status_code == 200 and head.content == b""
        monkeypatch.setattr(tts, "voice_from_audio", broken)
        err = api_error(_create(c, "bob", transcript=TRANSCRIPT), 503)
        assert err["code"] == "model_unavailable" and str(tmp_path) not in json.dumps(err)
        health = c.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        assert c.head("/health").status_code == 503
        assert "bob" not in server.store


# -- 6. other web origins cannot use an open server -----------------------------------------------------------------
def test_host_names_are_checked_without_a_key(open_server):
    c, port = open_server.client, open_server.port
    err = api_error(c.get("/v1/models", headers={"Host": "evil.example"}), 403)
    assert err["code"] == "host_not_allowed"
    api_error(c.get("/health", headers={"Host": f"rebind.evil.example:{port}"}), 403)
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert c.get("/v1/models", headers={"Host": host}).status_code == 200, host


def test_cross_site_posts_and_websockets_are_refused(open_server):
    c = open_server.client
    evil = {"Origin": "http://evil.example"}
    files = {"audio": ("v.wav", wav_bytes(tone(2.0)), "audio/wav")}
    r = c.post("/v1/audio/voices", files=files, data={"name": "forged", "consent": CONSENT}, headers=evil)
    assert api_error(r, 403)["code"] == "origin_not_allowed" and "forged" not in open_server.store
    api_error(c.post("/v1/audio/speech", json=SPEECH, headers=evil), 403)
    # Simple-form content types (what a cross-site form can send without a preflight) never reach a JSON route.
    r = c.post("/v1/audio/speech", content=json.dumps(SPEECH), headers={"Content-Type": "text/plain"})
    assert api_error(r, 415)["code"] == "unsupported_media_type"
    with pytest.raises(InvalidStatus) as refused:
        connect(f"{open_server.ws_url}/v1/audio/speech/stream", origin="http://evil.example", open_timeout=30)
    assert refused.value.response.status_code == 403
    # The server's own pages (same origin) are fine.
    own = {"Origin": f"http://127.0.0.1:{open_server.port}"}
    assert c.post("/v1/audio/speech", json=SPEECH, headers=own).status_code == 200


def test_allowed_origins_and_hosts_settings():
    def scope(host: str, origin: str | None = None) -> dict:
        headers = [(b"host", host.encode())] + ([(b"origin", origin.encode())] if origin else [])
        return {"type": "http", "scheme": "http", "headers": headers}

    check = HostOriginCheck(None, ("api.example.com",), ("https://app.example.com",))
    assert check.problem(scope("api.example.com")) is None
    assert check.problem(scope("api.example.com:443", "https://app.example.com")) is None
    assert check.problem(scope("api.example.com", "https://other.example.com")).status == 403
    assert check.problem(scope("localhost")).status == 403
    assert HostOriginCheck(None, ("*",), ("*",)).problem(scope("x.example", "https://y.example")) is None
    assert [host_name(h) for h in ("[::1]:80", "Example.COM:8000", "::1", "a.b")] == ["::1", "example.com", "::1",
                                                                                     "a.b"]
    assert ServerConfig().hosts == ("localhost", "127.0.0.1", "::1")
    assert ServerConfig(api_key=KEY).hosts == ("*",)  # with a key the key decides
    with pytest.raises(ValueError, match="allowed_origins"):
        ServerConfig(allowed_origins=("app.example.com",))


# -- 7. the smaller ones --------------------------------------------------------------------------------------------
def _raw(client: httpx.Client, body: str) -> httpx.Response:
    return client.post("/v1/audio/speech", content=body.encode(), headers={"Content-Type": "application/json"})


def test_lone_surrogates_and_nul_are_400s_not_500s(open_server):
    c = open_server.client
    body = json.dumps(SPEECH)
    for field in ("voice", "input", "model"):
        r = _raw(c, body.replace(f'"{field}": "{SPEECH[field]}"', f'"{field}": "a\\ud800b"'))
        assert "unicode" in api_error(r, 400, field)["message"].lower()
    api_error(_raw(c, body.replace('"input": "Hello there."', '"input": "Hello\\u0000there"')), 400, "input")
    api_error(_raw(c, body.replace('"voice": "alice"', '"voice": {"id": "\\udfff"}')), 400)
    with connect(f"{open_server.ws_url}/v1/audio/speech/stream", open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alice"}))
        ws.recv(timeout=60)
        ws.send('{"type": "input.text", "text": "Hi \\ud800 there"}')
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                message = ws.recv(timeout=60)
                if isinstance(message, str):
                    assert "unicode" in json.loads(message)["error"]["message"].lower()
    assert closed.value.rcvd.code == 1007


def test_bodies_are_strict_and_voice_references_bounded(open_server):
    c = open_server.client
    api_error(c.post("/v1/audio/speech", json={**SPEECH, "stream": "yes"}), 400, "stream")
    api_error(c.post("/v1/audio/speech", json={**SPEECH, "speed": "1.0"}), 400, "speed")
    api_error(c.post("/v1/audio/speech", json={**SPEECH, "seed": 1.5}), 400, "seed")
    assert c.post("/v1/audio/speech", json={**SPEECH, "speed": 1}).status_code == 200  # an int is a number
    err = api_error(c.post("/v1/audio/speech", json={**SPEECH, "voice": "x" * 10_000}), 400, "voice")
    assert len(err["message"]) < 200
    err = api_error(c.post("/v1/audio/speech", json={**SPEECH, "voice": "nobody"}), 400, "voice")
    assert "alice" not in err["message"]  # other clients' voices are not listed


def test_docs_and_schema_sit_behind_the_key(tts, tmp_path):
    with _server(tts, tmp_path / "voices", api_key=KEY) as server, httpx.Client(base_url=server.url) as c:
        for path in ("/docs", "/openapi.json", "/metrics", "/v1/models"):
            assert c.get(path).status_code == 401, path
        assert c.get("/redoc").status_code == 404
        # Every route of the app but /health (from its own schema, plus the two kept out of it): 401 without the
        # key, and with a wrong key of the same length.
        schema = c.get("/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
        routes = [(path.replace("{voice}", "alice"), method.upper()) for path, ops in schema["paths"].items()
                  for method in ops if path != "/health"] + [("/docs", "GET"), ("/openapi.json", "GET")]
        assert len(routes) >= 9
        wrong = {"Authorization": "Bearer " + "x" * len(KEY)}
        for path, method in routes:
            for headers in ({}, wrong):
                # Operator routes are off (403) without an admin key; the API key never opens them.
                expected = 403 if path.startswith("/v1/admin/") else 401
                assert c.request(method, path, headers=headers).status_code == expected, (method, path)
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{server.ws_url}/v1/audio/speech/stream", additional_headers=wrong, open_timeout=30)
        assert refused.value.response.status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        schema = c.get("/openapi.json", headers=auth).json()
        assert "/v1/audio/speech" in schema["paths"] and "/docs" not in schema["paths"]
        assert c.get("/v1/models", headers={**auth, "Host": "tts.example.com"}).status_code == 200
        assert c.get("/health").status_code == 200


def test_a_client_must_send_its_headers_in_time(open_server):
    with socket.create_connection(("127.0.0.1", open_server.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow")  # and then nothing
        started = time.perf_counter()
        assert sock.recv(1024) == b""  # the server closed it
        assert time.perf_counter() - started < 5  # header_timeout_s=1
    with socket.create_connection(("127.0.0.1", open_server.port), timeout=10) as sock:  # a whole request is fine
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("settings, message", [
    ({"max_audio_seconds": -1.0}, "max_audio_seconds"),
    ({"max_audio_seconds": float("nan")}, "max_audio_seconds"),
    ({"max_concurrency": True}, "max_concurrency"),
    ({"max_input_chars": "4096"}, "max_input_chars"),
    ({"max_audio_seconds": 900.0, "max_inflight_audio_seconds": 600.0}, "max_inflight_audio_seconds"),
    ({"allowed_hosts": ["localhost"]}, "allowed_hosts"),
    ({"header_timeout_s": 0}, "header_timeout_s"),
])
def test_server_settings_are_validated(settings, message):
    with pytest.raises(ValueError, match=message):
        ServerConfig(**settings)


# -- load, disconnects and crashes (issue #19's server rows) --------------------------------------------------------
def test_four_times_the_concurrency_gets_429s_and_health_stays_fast(tts, tmp_path):
    with _server(tts, tmp_path / "voices", max_concurrency=2, retry_after_s=2) as server:
        body = {**SPEECH, "input": "Hello there, this is a longer sentence for the load test. " * 2}
        barrier, answers = threading.Barrier(8), []

        def client() -> None:
            with httpx.Client(base_url=server.url, timeout=120) as c:
                barrier.wait()
                r = c.post("/v1/audio/speech", json=body)
                answers.append((r.status_code, r.headers.get("retry-after")))

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        health_s = []
        with httpx.Client(base_url=server.url, timeout=10) as c:
            while any(t.is_alive() for t in threads):
                started = time.perf_counter()
                assert c.get("/health").status_code == 200
                health_s.append(time.perf_counter() - started)
                time.sleep(0.05)
        for t in threads:
            t.join()
    statuses = sorted(status for status, _ in answers)
    assert statuses.count(429) >= 4 and set(statuses) <= {200, 429} and 200 in statuses, statuses
    assert all(retry == "2" for status, retry in answers if status == 429)
    assert health_s and max(health_s) < 0.5, f"slowest /health under load: {max(health_s):.3f} s"


def test_a_client_that_leaves_mid_stream_stops_its_work_within_one_chunk(tts, open_server, monkeypatch):
    sched = tts.engine.scheduler
    board = sched.board
    # The engine is held after its first chunk until the client has gone: otherwise a loaded machine may let it
    # finish the whole input (into the socket's buffers) before the client reads its first bytes, and there would
    # be nothing left to stop (CI once saw exactly that). Holding the vocoder worker does not hold the server: the
    # disconnect and the cancel it causes go on without it.
    emitted, held, client_gone = [], threading.Event(), threading.Event()
    emit = board.emit

    def held_emit(job, audio):
        if emitted:
            held.set()
            assert client_gone.wait(60), "the test never let the engine go on"
        emitted.append(audio.size)
        emit(job, audio)

    monkeypatch.setattr(board, "emit", held_emit)
    body = {**SPEECH, "input": "Hello there, this is a small test of the speech synthesizer. " * 10}
    try:
        with open_server.client.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            body_bytes = r.iter_raw()  # kept: a dropped iterator closes the connection (the client would be gone)
            next(body_bytes)
            # Still generating: the engine reaches its second chunk and is held there, with the client connected.
            # (Reading the first bytes through a throwaway `next(r.iter_raw())` closed the connection at once, so
            # the server's cancel raced this check: CI once read load (0, 0) here.)
            assert held.wait(30), ("the engine never reached a second chunk", emitted, sched.load)
            assert sched.load != (0, 0)
            at_close = sched.chunks_emitted
        # The server lets go of the request (cancelled, its admission slot freed) while the engine is still held.
        assert wait_until(lambda: open_server.state.admission.inflight == 0)
    finally:
        client_gone.set()
    assert wait_until(lambda: sched.load == (0, 0)), sched.load
    assert sched.chunks_emitted - at_close <= 1, sched.chunks_emitted - at_close


_WRITER = """
import sys, numpy as np, torch
from cadenza.voices import VoiceStore
store = VoiceStore(sys.argv[1])
t = np.arange(16000) / 16000
i = int(sys.argv[2])
while True:
    wav = (0.3 * np.sin(2 * np.pi * (150 + i % 200) * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    record = store.add(f"v{i}", (wav, 16000), "Just by listening.", "I agree to the use of my voice, signed.")
    store.cache_prompt(record.id, "m", {"x": torch.randn(64, 80)})
    print(record.id, flush=True)
    i += 1
"""


def test_the_voice_store_survives_kill_9_during_writes(tts, tmp_path):
    import os
    import signal
    import sqlite3
    import subprocess
    import sys

    from cadenza.voices.cosyvoice2_prompts import CosyVoice2Prompts

    directory, told = tmp_path / "voices", []
    for round_, wait_lines in enumerate((3, 7, 12)):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(directory), str(round_ * 100)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(wait_lines):
            told.append(proc.stdout.readline().strip())
        os.kill(proc.pid, signal.SIGKILL)  # in the middle of some write
        proc.wait()
    with sqlite3.connect(directory / "voices.sqlite3") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store = VoiceStore(directory)
    listed = store.list()
    assert set(told) <= {r.id for r in listed}  # every voice a writer reported is there
    prompts = CosyVoice2Prompts(tts, store)
    for record in listed:  # and every listed voice is usable: audio, cache (whole or absent), model features
        samples, sr = store.audio(record.id)
        assert sr == 16000 and samples.size == 16000
        cached = store.cached_prompt(record.id, "m")
        assert cached is None or cached["x"].shape == (64, 80)
        assert prompts.resolve(record.id).prompt is not None
    # A cache file half-written by a killed writer is a temporary never read; the next store opened sweeps old ones.
    leftovers = list(directory.glob("cache/*/.tmp-*"))
    for path in leftovers:
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    store.close()
    VoiceStore(directory).close()
    assert not any(p.exists() for p in leftovers)
