"""The speech server end to end: a real uvicorn server on 127.0.0.1 over the toy model, a real HTTP client.

Random weights make noise, so the audio is checked by what must hold for any weights: formats decode at the right
rate and length, the server says exactly what the Python API says for the same voice and seed, errors are
OpenAI-shaped with the right status, and a client that leaves frees its engine state.
"""

from __future__ import annotations

import base64
import io
import json
import re
import struct

import httpx
import numpy as np
import pytest
import soundfile as sf

from cadenza.audio.wav_stream import pcm16
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, PROMPT_SR, LiveServer, tone, wait_until, wav_bytes

KEY = "test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXT = "Hello there, this is a test."
TRANSCRIPT = "Just by listening a few minutes a day."


@pytest.fixture(scope="module")
def live(tts, tmp_path_factory):
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    config = ServerConfig(api_key=KEY, max_segment_tokens=24)
    app = create_app(tts, store, config)
    with LiveServer(app) as server:
        server.store, server.app_state = store, app.state.cadenza
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
            server.client = client
            files = {"audio": ("alice.wav", wav_bytes(tone(2.0)), "audio/wav")}
            # keep_audio: the tests give the API the same recording to compare with
            r = client.post("/v1/audio/voices", files=files, data={"name": "alice", "transcript": TRANSCRIPT,
                                                                      "consent": CONSENT, "keep_audio": "true"})
            assert r.status_code == 201, r.text
            server.alice = r.json()["id"]
            yield server


def _speech(live, **fields) -> httpx.Response:
    body = {"model": "tts-1", "input": TEXT, "voice": "alice", "seed": 1, **fields}
    return live.client.post("/v1/audio/speech", json=body)


def _python_chunks(tts, live, text: str = TEXT, seed: int = 1, **kwargs) -> list[np.ndarray]:
    """What the Python API says for the same stored voice and seed (the server must say exactly this)."""
    samples, sr = live.store.audio(live.alice)
    return list(tts.synthesize_stream(text, prompt_wav=(samples, sr), prompt_text=TRANSCRIPT, seed=seed, **kwargs))


def _decode(data: bytes) -> tuple[np.ndarray, int]:
    import av

    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray() for f in container.decode(audio=0)]
        rate = container.streams.audio[0].codec_context.sample_rate
    return np.concatenate([f.reshape(-1) if f.shape[0] == 1 else f[0] for f in frames]), rate


def _assert_openai_error(r: httpx.Response, status: int, param: str | None = "__any__") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param != "__any__":
        assert err["param"] == param, err
    return err


def test_health_models_and_api_key(tts, live):
    assert httpx.get(f"{live.url}/health").json()["status"] == "ok"  # open, for load balancers
    for path in ("/v1/models", "/metrics", "/v1/audio/voices"):
        r = httpx.get(f"{live.url}{path}")
        err = _assert_openai_error(r, 401)
        assert err["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
        _assert_openai_error(httpx.get(f"{live.url}{path}", headers={"Authorization": "Bearer wrong-key-000"}), 401)
    _assert_openai_error(httpx.post(f"{live.url}/v1/audio/speech", json={"model": "tts-1"}), 401)
    models = live.client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == tts.directory.name
    caps = models["data"][0]["capabilities"]
    assert caps["family"] == "cosyvoice2" and caps["sample_rate"] == tts.sample_rate and caps["speed"] == [0.5, 2.0]
    assert models["data"][0]["limits"]["max_active"] == tts.engine.scheduler.config.max_active


@pytest.fixture(scope="module")
def reference_pcm(tts, live) -> np.ndarray:
    r = _speech(live, response_format="pcm")
    assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000" and r.headers["x-seed"] == "1"
    pcm = np.frombuffer(r.content, dtype="<i2")
    assert pcm.size > 0
    return pcm


def test_server_says_what_the_python_api_says(tts, live, reference_pcm):
    chunks = _python_chunks(tts, live)
    assert reference_pcm.tobytes() == pcm16(np.concatenate(chunks))


@pytest.mark.parametrize(("fmt", "rate", "tolerance"),
                         [("wav", 24000, 0.0), ("flac", 24000, 0.0), ("mp3", 24000, 0.12), ("aac", 24000, 0.12),
                          ("opus", 48000, 0.03)])  # Opus always decodes at 48 kHz
def test_every_response_format_decodes(live, reference_pcm, fmt, rate, tolerance):
    r = _speech(live, response_format=fmt)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith({"wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg",
                                                 "aac": "audio/aac", "opus": "audio/ogg"}[fmt])
    assert r.headers.get("transfer-encoding") == "chunked"  # streamed, not buffered
    samples, sr = _decode(r.content)
    expected = reference_pcm.size / 24000
    assert sr == rate and abs(samples.size / sr - expected) <= tolerance + 1e-9, (samples.size / sr, expected)
    if fmt in ("wav", "flac"):  # lossless: the very same samples
        assert samples.dtype == np.int16 and np.array_equal(samples, reference_pcm)
    if fmt == "wav":
        assert r.content[4:8] == b"\xff\xff\xff\xff"  # streaming convention: sizes unknown up front
        data, sr = sf.read(io.BytesIO(r.content), dtype="int16")
        assert sr == 24000 and np.array_equal(data, reference_pcm)


def test_sse_stream(tts, live, reference_pcm):
    with live.client.stream("POST", "/v1/audio/speech", json={"model": "gpt-4o-mini-tts", "input": TEXT,
                                                               "voice": "alice", "seed": 1, "response_format": "pcm",
                                                               "stream_format": "sse"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) == len(_python_chunks(tts, live)) >= 2  # one event per engine chunk, as produced
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == reference_pcm.tobytes()
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["usage"]["output_tokens"] == reference_pcm.size // 960


def test_non_streamed_wav_has_exact_sizes(tts, live):
    r = _speech(live, response_format="wav", stream=False)
    assert r.status_code == 200 and int(r.headers["content-length"]) == len(r.content)
    riff, data_size = struct.unpack("<I", r.content[4:8])[0], struct.unpack("<I", r.content[40:44])[0]
    assert riff == len(r.content) - 8 and data_size == len(r.content) - 44
    samples, _ = live.store.audio(live.alice)
    whole = tts.synthesize(TEXT, prompt_wav=(samples, PROMPT_SR), prompt_text=TRANSCRIPT, seed=1).samples
    assert r.content[44:] == pcm16(whole)


def test_speed(tts, live):
    # Streamed at the asked rate, exactly as the Python API streams it.
    r = _speech(live, response_format="pcm", speed=1.5)
    assert r.status_code == 200 and r.content == pcm16(np.concatenate(_python_chunks(tts, live, speed=1.5)))
    for speed in (0.3, 3.0):  # OpenAI's range, outside the model's
        assert "0.5 to 2" in _assert_openai_error(_speech(live, speed=speed), 400, "speed")["message"]
    _assert_openai_error(_speech(live, speed=5.0), 400, "speed")


def test_instructions_voice_objects_and_long_inputs(tts, live):
    r = _speech(live, response_format="pcm", instructions="Speak slowly and calmly.")
    assert r.status_code == 200 and len(r.content) > 0
    _assert_openai_error(_speech(live, instructions="?!"), 400, "instructions")
    blank = _speech(live, response_format="pcm", instructions="   ")  # blank instructions are ignored
    assert blank.status_code == 200 and blank.content == _speech(live, response_format="pcm").content
    by_id = _speech(live, response_format="pcm", voice={"id": live.alice})
    assert by_id.status_code == 200 and by_id.content == blank.content
    # max_segment_tokens=24: this input is spoken as several segments, seeds 7, 8, ...
    long_text = "Hello there. This is good. See you soon."
    r = _speech(live, response_format="pcm", input=long_text, seed=7)
    assert r.status_code == 200

    segments = tts.segments(long_text, max_tokens=24)
    assert len(segments) > 1
    # The watermark runs across the whole answer (one mark per output), not segment by segment.
    samples, sr = live.store.audio(live.alice)
    raw = [np.concatenate(list(tts.engine.stream(tts.request(s, prompt_wav=(samples, sr), prompt_text=TRANSCRIPT,
                                                              seed=7 + i)))) for i, s in enumerate(segments)]
    assert r.content == pcm16(tts.mark.whole(np.concatenate(raw)))


@pytest.mark.parametrize(
    ("body", "param"),
    [({"input": TEXT, "voice": "alice"}, "model"), ({"model": "tts-1", "voice": "alice"}, "input"),
     ({"model": "tts-1", "input": "", "voice": "alice"}, "input"),
     ({"model": "tts-1", "input": "x" * 4097, "voice": "alice"}, "input"),
     ({"model": "tts-1", "input": "?!... ,,", "voice": "alice"}, "input"),
     ({"model": "tts-1", "input": TEXT, "voice": "alice", "response_format": "ogg"}, "response_format"),
     ({"model": "tts-1", "input": TEXT, "voice": "alice", "stream_format": "chunks"}, "stream_format"),
     ({"model": "tts-1", "input": TEXT, "voice": "alice", "speed": "fast"}, "speed"),
     ({"model": "tts-1", "input": TEXT, "voice": "alice", "temperature": 0.5}, "temperature"),
     ({"model": "tts-1", "input": TEXT, "voice": "alice", "seed": -1}, "seed"),
     ({"model": "tts-1", "input": 42, "voice": "alice"}, "input"),
     ({"model": "tts-1", "input": TEXT}, "voice"), ({"model": "tts-1", "input": TEXT, "voice": "nobody"}, "voice"),
     ({"model": "tts-1", "input": TEXT, "voice": "../../etc/passwd"}, "voice"),
     ({"model": "tts-1", "input": TEXT, "voice": {"id": "voice_../../../../../../etc"}}, "voice"),
     ({"model": "tts-1", "input": TEXT, "voice": {"name": "alice"}}, None), ([1, 2], None)],
)
def test_bad_requests_are_400(live, body, param):
    err = _assert_openai_error(live.client.post("/v1/audio/speech", json=body), 400)
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param or err["param"].startswith(param), err


def test_malformed_bodies_and_unknown_routes(live):
    r = live.client.post("/v1/audio/speech", content=b"{not json", headers={"Content-Type": "application/json"})
    _assert_openai_error(r, 400)
    _assert_openai_error(live.client.get("/v1/nothing/here"), 404)
    _assert_openai_error(live.client.get("/v1/audio/speech"), 405)
    huge = live.client.post("/v1/audio/speech", content=b"x" * (11 * 2**20), headers={"Content-Type": "application/json"})
    assert _assert_openai_error(huge, 413)["code"] == "request_too_large"
    assert live.client.get("/health").status_code == 200  # still serving


def test_client_disconnect_cancels_the_generation(tts, live):
    sched = tts.engine.scheduler
    before = _metric(live, "cadenza_client_disconnects_total")
    body = {"model": "tts-1", "input": "Hello there, this is a small test of the speech synthesizer. " * 4,
            "voice": "alice", "seed": 3, "response_format": "pcm"}
    with live.client.stream("POST", "/v1/audio/speech", json=body) as r:
        assert r.status_code == 200
        body_bytes = r.iter_raw()  # kept open: dropping the iterator would close the connection here already
        first = next(body_bytes)
        assert len(first) > 0 and sched.load[0] + sched.load[1] >= 1  # still generating
    # The response is closed after the first chunk: the server cancels the request and frees its state.
    assert wait_until(lambda: sched.load == (0, 0) and live.app_state.admission.inflight == 0), sched.load
    assert wait_until(lambda: _metric(live, "cadenza_client_disconnects_total") == before + 1)
    # Non-streamed (the whole utterance first): a client that gives up waiting cancels it too.
    with pytest.raises(httpx.ReadTimeout):
        live.client.post("/v1/audio/speech", json={**body, "stream": False}, timeout=0.5)
    assert wait_until(lambda: sched.load == (0, 0) and live.app_state.admission.inflight == 0), sched.load
    assert wait_until(lambda: _metric(live, "cadenza_client_disconnects_total") == before + 2)


def _metric(live, name: str) -> float:
    text = live.client.get("/metrics").text
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_metrics_exposition(live, reference_pcm):
    text = live.client.get("/metrics").text
    assert live.client.get("/metrics").headers["content-type"].startswith("text/plain; version=0.0.4")
    sample = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*",?)+\})? -?[0-9.e+-]+(Inf)?$')
    for line in text.strip().splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or sample.match(line), line
    assert re.search(r'^cadenza_requests_total\{endpoint="/v1/audio/speech",status="200"\} [1-9]', text, re.M)
    assert re.search(r'^cadenza_requests_total\{endpoint="/v1/audio/speech",status="400"\} [1-9]', text, re.M)
    assert re.search(r'^cadenza_first_chunk_seconds_count\{endpoint="/v1/audio/speech"\} [1-9]', text, re.M)
    assert re.search(r'^cadenza_first_chunk_seconds_bucket\{endpoint="/v1/audio/speech",le="\+Inf"\} [1-9]', text,
                     re.M)
    assert re.search(r'^cadenza_real_time_factor_count\{endpoint="/v1/audio/speech"\} [1-9]', text, re.M)
    assert _metric(live, "cadenza_audio_seconds_total") > 0
    for gauge in ("cadenza_active_requests", "cadenza_queue_depth", "cadenza_inflight_requests"):
        assert re.search(rf"^{gauge} \d+$", text, re.M), gauge
