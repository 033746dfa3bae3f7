"""Bi-streaming over the WebSocket (real uvicorn + the ``websockets`` client): protocol, errors, cancellation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from cadenza import CadenzaError
from cadenza.audio.wav_stream import pcm16
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, LiveServer, drain_ws, speech_prompt, wait_until

KEY = "ws-test-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
TRANSCRIPT = "Just by listening."
PIECES = ["Hello ", "there, ", "this ", "text ", "arrives ", "piece ", "by ", "piece ", "from ", "an ", "LLM. "]


@pytest.fixture(scope="module")
def live(tts, tmp_path_factory):
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    store.add("alice", speech_prompt(), TRANSCRIPT, CONSENT)
    with LiveServer(create_app(tts, store, ServerConfig(api_key=KEY, ws_idle_timeout_s=1.0))) as server:
        server.store = store
        yield server


def _connect(live):
    return connect(f"{live.ws_url}/v1/audio/speech/stream", additional_headers=AUTH, open_timeout=30)


def _python_bistream(tts, live, seed: int, pieces: list[str] = PIECES) -> bytes | None:
    """What the Python API's bi-streaming says for the same voice, pieces and seed (None: the random-weight LM
    emitted a special token mid-text for this seed, which the engine reports as an error)."""
    samples, sr = live.store.audio(live.store.get("alice").id)
    try:
        chunks = list(tts.synthesize_stream(iter(pieces), prompt_wav=(samples, sr), prompt_text=TRANSCRIPT, seed=seed))
    except CadenzaError:
        return None
    return pcm16(np.concatenate(chunks))


def _same_speech(a: bytes, b: bytes) -> bool:
    """The same 16-bit speech up to float32 round-off: the engine's chunk schedule follows when text and tokens
    arrive (a loaded machine moves it), and chunked flow equals whole flow only to round-off, so a sample may move
    by an LSB; other words or other tokens change the length or whole stretches."""
    x, y = np.frombuffer(a, "<i2").astype(np.int32), np.frombuffer(b, "<i2").astype(np.int32)
    return len(x) == len(y) and int(np.abs(x - y).max(initial=0)) <= 4


def test_bistream_session(tts, live):
    seed, expected = next((s, e) for s in range(1, 12) if (e := _python_bistream(tts, live, s)) is not None)
    with _connect(live) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alice", "seed": seed}))
        start = json.loads(ws.recv(timeout=60))
        assert start == {"type": "audio.start", "sample_rate": 24000, "format": "pcm_s16le", "seed": seed}
        for piece in PIECES:
            ws.send(json.dumps({"type": "input.text", "text": piece}))
        ws.send(json.dumps({"type": "input.done"}))
        events, audio, code = drain_ws(ws)
    assert code == 1000 and events[-1]["type"] == "audio.done", events
    assert events[-1]["audio_seconds"] == pytest.approx(len(audio) / 2 / 24000, abs=1e-3)
    assert _same_speech(audio, expected)
    assert wait_until(lambda: tts.engine.scheduler.load == (0, 0))


def test_whitespace_pieces_keep_the_words_apart(tts, live):
    """A client (an LLM's tokens) may send the space between two words as a piece of its own. It must not be lost
    ("Hellothere") nor encoded alone: it goes with the next word, as in the whole text (" there", one BPE token), so
    the server and the Python API say what pieces with the spaces in front of the words say."""
    split = [part for piece in PIECES for part in (piece.rstrip(), " ")]  # "Hello", " ", "there,", " ", ...
    joined = [PIECES[0].rstrip()] + [" " + piece.rstrip() for piece in PIECES[1:]]  # "Hello", " there,", ...
    assert "".join(split).rstrip() == "".join(joined) == "".join(PIECES).rstrip()
    seed, expected = next((s, e) for s in range(1, 12) if (e := _python_bistream(tts, live, s, joined)) is not None)
    assert _same_speech(_python_bistream(tts, live, seed, split), expected)
    with _connect(live) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alice", "seed": seed}))
        assert json.loads(ws.recv(timeout=60))["type"] == "audio.start"
        for piece in split:
            ws.send(json.dumps({"type": "input.text", "text": piece}))
        ws.send(json.dumps({"type": "input.done"}))
        events, audio, code = drain_ws(ws)
    assert code == 1000 and events[-1]["type"] == "audio.done", events
    assert _same_speech(audio, expected)


@pytest.mark.parametrize(
    ("messages", "match"),
    [(["not json"], "not valid JSON"), ([{"type": "input.text", "text": "hi"}], "session.config"),
     ([{"type": "session.config"}], "voice"), ([{"type": "session.config", "voice": "nobody"}], "unknown voice"),
     ([{"type": "session.config", "voice": "../../etc/passwd"}], "unknown voice"),
     ([{"type": "session.config", "voice": "alice", "temperature": 1}], "temperature"),
     ([{"type": "session.config", "voice": "alice"}, {"type": "input.text", "text": 5}], "string 'text'"),
     ([{"type": "session.config", "voice": "alice"}, {"type": "dance"}], "unknown message type"),
     ([{"type": "session.config", "voice": "alice"}, {"type": "input.text", "text": "hi", "lexicn": []}],
      "input.text takes no field 'lexicn'"),  # was ignored, while session.config's were refused
     ([{"type": "session.config", "voice": "alice"}, {"type": "input.text", "text": "Hi."}, {"type": "input.done",
                                                                                             "now": True}],
      "input.done takes no field 'now'"),
     ([{"type": "session.config", "voice": "alice"}, {"type": "input.done"}], "nothing to speak"),
     ([{"type": "session.config", "voice": "alice"}, {"type": "input.text", "text": " ?! "}, {"type": "input.done"}],
      "nothing to speak"),
     ([{"type": "session.config", "voice": "alice"}, {"type": "input.text", "text": "x" * 4097}], "longer than")],
)
def test_protocol_errors(tts, live, messages, match):
    with _connect(live) as ws:
        for m in messages:
            ws.send(m if isinstance(m, str) else json.dumps(m))
        events, _, code = drain_ws(ws)
    errors = [e for e in events if e["type"] == "error"]
    assert code == 1007 and len(errors) == 1 and match in errors[0]["error"]["message"], events
    assert wait_until(lambda: tts.engine.scheduler.load == (0, 0))


def test_binary_messages_are_refused(live):
    with _connect(live) as ws:
        ws.send(b"\x00\x01")
        events, _, code = drain_ws(ws)
    assert code == 1007 and "binary" in events[-1]["error"]["message"]


def test_api_key_is_checked_before_the_handshake(live):
    with pytest.raises(InvalidStatus) as info:
        with connect(f"{live.ws_url}/v1/audio/speech/stream", open_timeout=30):
            pass
    assert info.value.response.status_code == 401
    with pytest.raises(InvalidStatus):
        with connect(f"{live.ws_url}/v1/audio/speech/stream", additional_headers={"Authorization": "Bearer nope"}):
            pass


def test_disconnect_and_idle_timeout_free_the_request(tts, live):
    sched = tts.engine.scheduler
    with _connect(live) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alice", "seed": 1}))
        ws.recv(timeout=60)
        for piece in PIECES:
            ws.send(json.dumps({"type": "input.text", "text": piece}))
        assert isinstance(ws.recv(timeout=60), bytes)  # audio flows before input.done
        assert sched.load[0] == 1
    # The client walked away mid-utterance (the context closed the connection).
    assert wait_until(lambda: sched.load == (0, 0)), sched.load
    # A client that goes quiet before input.done is timed out (ws_idle_timeout_s=1) and its request freed.
    with _connect(live) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alice", "seed": 1}))
        ws.recv(timeout=60)
        ws.send(json.dumps({"type": "input.text", "text": "Hello"}))  # fewer tokens than the LM's text group
        assert wait_until(lambda: sched.load == (1, 0)), sched.load
        events, _, code = drain_ws(ws)
    assert code == 1007 and "no text for 1 s" in events[-1]["error"]["message"]
    assert wait_until(lambda: sched.load == (0, 0)), sched.load


def test_sessions_without_text_hold_nothing_and_empty_pieces_do_not_keep_them_open(tts, live):
    """A session takes an engine request and an admission slot only once it has something to speak, and only text
    with something in it moves its idle deadline: whitespace every 0.3 s does not keep it past 1 s."""
    import time

    sched, admission = tts.engine.scheduler, live.server.config.app.state.cadenza.admission
    with _connect(live) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alice", "seed": 1}))
        ws.recv(timeout=60)
        started = time.monotonic()
        try:
            for _ in range(20):
                ws.send(json.dumps({"type": "input.text", "text": " "}))
                assert sched.load == (0, 0) and admission.inflight == 0
                time.sleep(0.3)
        except ConnectionClosed:
            pass
        events, _, code = drain_ws(ws)
    assert code == 1007 and "no text for 1 s" in events[-1]["error"]["message"]
    assert time.monotonic() - started < 3.0
