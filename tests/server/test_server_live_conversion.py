"""``WS /v1/audio/voice-conversion/stream`` on a live server (real uvicorn on loopback, a real WebSocket client): source
audio sent as 16-bit frames while it is read, converted audio back as it is made, the same bytes as the Python API's
``live_conversion`` into the same voice; every bad message or source ends the session with a specific error, and
the engine slot is free after every ending."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from cadenza.audio.resample import resample
from cadenza.audio.wav_stream import pcm16
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, LiveServer, drain_ws, speech_prompt, wait_until

KEY = "live-vc-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
PATH = "/v1/audio/voice-conversion/stream"
ALICE = {"type": "session.config", "voice": "alice"}


@pytest.fixture(scope="module")
def live(tts, tmp_path_factory):
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    store.add("alice", speech_prompt(), "Just by listening.", CONSENT)
    config = ServerConfig(api_key=KEY, ws_idle_timeout_s=2.0, max_conversion_seconds=4.0)
    with LiveServer(create_app(tts, store, config)) as server:
        server.store = store
        yield server


@pytest.fixture(scope="module")
def source() -> np.ndarray:
    """2.5 s of 16 kHz 16-bit speech, as a microphone gives it."""
    samples, sr = speech_prompt(2.5)
    mono = samples if samples.ndim == 1 else samples.mean(axis=1)
    return (resample(torch.from_numpy(mono.astype(np.float32)), sr, 16000).numpy() * 32767).astype(np.int16)


def _session(live, config: dict, frames: list[bytes], done: bool = True) -> tuple[list[dict], bytes, int | None]:
    """Send ``config``, the frames, ``input.done``; everything the server sends until it closes."""
    with connect(f"{live.ws_url}{PATH}", additional_headers=AUTH, open_timeout=30) as ws:
        try:
            ws.send(json.dumps(config))
            for frame in frames:
                ws.send(frame)
            if done:
                ws.send(json.dumps({"type": "input.done"}))
        except ConnectionClosed:
            pass  # the server ended the session early: what it sent says why
        return drain_ws(ws)


def _frames(samples: np.ndarray, size: int = 1600) -> list[bytes]:
    return [samples[i:i + size].astype("<i2").tobytes() for i in range(0, samples.size, size)]


def _free(tts) -> bool:
    return wait_until(lambda: tts.engine.scheduler.load == (0, 0))


def test_live_session_says_what_the_python_api_says(tts, live, source):
    events, audio, code = _session(live, {"type": "session.config", "voice": "alice", "seed": 3}, _frames(source))
    assert code == 1000, events
    start, done = events[0], events[-1]
    assert start == {"type": "audio.start", "sample_rate": tts.sample_rate, "format": "pcm_s16le", "seed": 3,
                     "input_sample_rate": 16000, "input_format": "pcm_s16le", "max_source_seconds": 4.0}
    assert done["type"] == "audio.done" and done["source_seconds"] == pytest.approx(source.size / 16000, abs=1e-3)
    prompt = live.store.audio(live.store.get("alice").id)
    with tts.live_conversion(16000, prompt_wav=prompt, seed=3) as python:
        python.push(source)
        python.end()
        expected = pcm16(np.concatenate(list(python)))
    assert audio == expected
    assert done["audio_seconds"] == pytest.approx(len(audio) / 2 / tts.sample_rate, abs=1e-3)
    assert done["first_chunk_seconds"] is not None
    # another rate: 44.1 kHz frames of the same speech
    at44 = (resample(torch.from_numpy(source / 32768.0).float(), 16000, 44100).numpy() * 32767).astype(np.int16)
    events, audio, code = _session(live, {"type": "session.config", "voice": "alice", "sample_rate": 44100},
                                   _frames(at44, 4410))
    assert code == 1000, events
    assert abs(len(audio) / 2 / tts.sample_rate - source.size / 16000) < 0.1
    assert _free(tts)


@pytest.mark.parametrize(("config", "frames", "param", "words"), [
    ({"type": "session.config", "sample_rate": 1000}, [], "sample_rate", "valid session.config"),
    ({"type": "session.config", "voice": "nobody"}, [], "voice", "nobody"),
    ({"type": "session.config"}, [], "voice", "no default voice"),
    ({"type": "session.config", "extra": 1}, [], "extra", "valid session.config"),
    (ALICE, [b"\x00\x01\x02"], "audio", "whole number of samples"),
    (ALICE, [json.dumps({"type": "input.text", "text": "hi"})], "type", "binary audio"),
    (ALICE, [np.zeros(16000, "<i2").tobytes()], "audio", "silent"),
    (ALICE, [np.zeros(3200, "<i2").tobytes()], "audio", "too short"),
    (ALICE, [np.full(8000, 3000, "<i2").tobytes()] * 10, "audio", "too long: past 4 s"),
])
def test_bad_sessions_end_with_a_specific_error(tts, live, config, frames, param, words):
    events, audio, code = _session(live, config, frames)
    assert code == 1007, events
    error = events[-1]
    assert error["type"] == "error" and error["fatal"] is True, error
    assert error["error"]["param"] == param and words in error["error"]["message"], error
    assert _free(tts)


def test_idle_source_times_out_and_the_key_is_required(tts, live, source):
    with connect(f"{live.ws_url}{PATH}", additional_headers=AUTH, open_timeout=30) as ws:
        ws.send(json.dumps(ALICE))
        ws.send(source[:8000].astype("<i2").tobytes())
        events = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                message = ws.recv(timeout=30)
                if isinstance(message, str):
                    events.append(json.loads(message))
        assert closed.value.rcvd.code == 1007
        assert "no audio for 2 s" in events[-1]["error"]["message"]
    assert _free(tts)
    with pytest.raises(InvalidStatus) as info:
        with connect(f"{live.ws_url}{PATH}", open_timeout=30):
            pass
    assert info.value.response.status_code == 401


def test_concurrent_live_sessions_each_say_what_they_say_alone(tts, live, source):
    """Four live sessions at once (two sources, four seeds), their frames sent at a live pace, each answer what it
    answers alone (to a 16-bit step or two: streams whose flow or HiFT runs in one batch may round differently);
    afterwards no admission slot or engine request is held."""
    import threading
    import time

    sources = [source[:24000], source[8000:40000]]
    jobs = [(k % 2, 20 + k) for k in range(4)]

    def one(job, paced: bool) -> bytes:
        index, seed = job
        frames = _frames(sources[index], 800)
        if paced:  # 50 ms of source every 10 ms: slower than the engine, faster than a microphone
            frames = [f for frame in frames for f in (frame, None)]
        with connect(f"{live.ws_url}{PATH}", additional_headers=AUTH, open_timeout=30) as ws:
            ws.send(json.dumps({**ALICE, "seed": seed}))
            for frame in frames:
                if frame is None:
                    time.sleep(0.01)
                else:
                    ws.send(frame)
            ws.send(json.dumps({"type": "input.done"}))
            events, audio, code = drain_ws(ws)
        assert code == 1000, events
        return audio

    alone = [one(job, paced=False) for job in jobs]
    together: list[bytes | None] = [None] * len(jobs)

    def run(k: int) -> None:
        together[k] = one(jobs[k], paced=True)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for a, b in zip(alone, together):
        a, b = np.frombuffer(a, "<i2").astype(int), np.frombuffer(b, "<i2").astype(int)
        assert a.size == b.size and np.abs(a - b).max() <= 2
    assert _free(tts)
    health = httpx.get(f"{live.url}/health", timeout=30).json()
    assert health["inflight"] == 0 and health["active"] == 0 and health["queued"] == 0, health


def test_a_busy_server_refuses_and_a_dropped_client_frees_its_slot(tts, tmp_path):
    """With one synthesis slot, a second live session while the first is open is refused busy (1013); a client that
    drops its connection mid-source frees the slot and the engine, and the next session is served."""
    store = VoiceStore(tmp_path / "voices")
    store.add("alice", speech_prompt(), "Just by listening.", CONSENT)
    config = ServerConfig(api_key=KEY, max_concurrency=1, ws_idle_timeout_s=5.0)
    second_source = (np.sin(np.arange(16000) / 5) * 8000).astype("<i2")
    with LiveServer(create_app(tts, store, config)) as server:
        url = f"{server.ws_url}{PATH}"
        with connect(url, additional_headers=AUTH, open_timeout=30) as first:
            first.send(json.dumps(ALICE))
            assert json.loads(first.recv(timeout=60))["type"] == "audio.start"
            first.send(second_source.tobytes())
            with connect(url, additional_headers=AUTH, open_timeout=30) as second:
                second.send(json.dumps(ALICE))
                events, _, code = drain_ws(second)
            assert code == 1013 and "busy" in events[-1]["error"]["message"], events
        # the first client went away without input.done: its slot and its engine request are freed
        assert _free(tts)
        assert wait_until(lambda: httpx.get(f"{server.url}/health", timeout=30).json()["inflight"] == 0)
        with connect(url, additional_headers=AUTH, open_timeout=30) as third:
            third.send(json.dumps(ALICE))
            for frame in _frames(second_source):
                third.send(frame)
            third.send(json.dumps({"type": "input.done"}))
            events, audio, code = drain_ws(third)
        assert code == 1000 and events[-1]["type"] == "audio.done", events
        assert abs(len(audio) / 2 / tts.sample_rate - 1.0) < 0.05
    store.close()
