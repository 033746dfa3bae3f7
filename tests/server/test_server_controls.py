"""Speed while streaming and word timestamps, end to end: a live server on 127.0.0.1 with the built-in model (real
speech, so word timings mean something), a real HTTP client and a real WebSocket client."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import LiveServer

KEY = "controls-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXT = "Please open the window. The room is warm today, and the air feels heavy. We could go for a walk."
SHORT = "Please open the window."
SR = 24000


@pytest.fixture(scope="module")
def live(builtin_tts, tmp_path_factory):
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    try:
        with LiveServer(create_app(builtin_tts, store, ServerConfig(api_key=KEY))) as server:
            with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
                server.client = client
                yield server
    finally:
        store.close()


def _sse(live, **fields) -> list[dict]:
    body = {"model": "cadenza-tiny", "input": TEXT, "seed": 5, "response_format": "pcm", "stream_format": "sse",
            **fields}
    events = []
    with live.client.stream("POST", "/v1/audio/speech", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


def _check_words(words: list[dict], seconds: float) -> None:
    assert [w["word"] for w in words] == TEXT.split()
    end = 0.0
    for w in words:
        assert end <= w["start"] <= w["end"] <= seconds + 1e-3, (words, seconds)
        assert TEXT[w["start_char"]: w["end_char"]] == w["word"]
        end = w["end"]
    assert words[-1]["end"] > seconds / 2  # the words cover the speech, not a corner of it


def test_sse_sends_word_events_with_the_audio_at_any_speed(live):
    for speed in (1.5,):  # speed 1: the WebSocket test
        events = _sse(live, timestamps=True, speed=speed)
        kinds = [e["type"] for e in events]
        assert kinds[-1] == "speech.audio.done" and "error" not in kinds
        audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
        _check_words([e for e in events if e["type"] == "speech.word"], len(audio) / 2 / SR)
        # sent with the chunks: some words come before the last audio
        last_audio = max(i for i, k in enumerate(kinds) if k == "speech.audio.delta")
        assert kinds.index("speech.word") < last_audio


def test_speed_streams_over_http_and_scales_the_duration(live):
    lengths = {}
    for speed in (1.0, 0.5, 2.0):
        r = live.client.post("/v1/audio/speech", json={"model": "cadenza-tiny", "input": SHORT, "seed": 9,
                                                       "response_format": "pcm", "speed": speed})
        assert r.status_code == 200
        lengths[speed] = len(r.content)
    for speed in (0.5, 2.0):
        assert abs(lengths[speed] / lengths[1.0] * speed - 1) < 0.05, lengths


def test_timestamps_need_events(live):
    caps = live.client.get("/v1/models").json()["data"][0]["capabilities"]
    assert caps["speed"] == [0.5, 2.0] and caps["word_timestamps"] is True
    r = live.client.post("/v1/audio/speech", json={"model": "cadenza-tiny", "input": TEXT, "timestamps": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "timestamps"
    r = live.client.post("/v1/audio/speech", json={"model": "cadenza-tiny", "input": TEXT, "timestamps": "yes",
                                                   "stream_format": "sse"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "timestamps"


def _ws_session(live, pieces: list[str], **config) -> tuple[list, bytes, int]:
    """(messages: "audio" or the JSON ones, PCM bytes, close code) of one WebSocket session."""
    with connect(f"{live.ws_url}/v1/audio/speech/stream", additional_headers=AUTH, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.config", **config}))
        messages, audio = [], b""
        try:
            first = json.loads(ws.recv(timeout=60))
            messages.append(first)
            if first["type"] == "audio.start":
                for piece in pieces:
                    ws.send(json.dumps({"type": "input.text", "text": piece}))
                ws.send(json.dumps({"type": "input.done"}))
            while True:
                message = ws.recv(timeout=120)
                if isinstance(message, bytes):
                    audio += message
                    messages.append("audio")
                else:
                    messages.append(json.loads(message))
        except ConnectionClosed as closed:
            return messages, audio, closed.rcvd.code if closed.rcvd else None


def test_websocket_sends_word_messages(live):
    pieces = ["Please open ", "the window. ", "The room is ", "warm today, and the air ", "feels heavy. We could ",
              "go for a walk."]
    assert "".join(pieces) == TEXT
    messages, audio, code = _ws_session(live, pieces, seed=2, timestamps=True)
    assert code == 1000 and messages[0]["type"] == "audio.start"
    words = [m for m in messages if isinstance(m, dict) and m["type"] == "word"]
    _check_words(words, len(audio) / 2 / SR)
    assert messages[-1]["type"] == "audio.done"
    assert abs(messages[-1]["audio_seconds"] - len(audio) / 2 / SR) < 1e-3
    assert np.frombuffer(audio, "<i2").size == len(audio) // 2


def test_websocket_speed(live):
    pieces = ["Please open ", "the window."]
    assert "".join(pieces) == SHORT
    lengths = {speed: len(_ws_session(live, pieces, seed=4, speed=speed)[1]) for speed in (1.0, 2.0)}
    assert abs(lengths[2.0] / lengths[1.0] * 2 - 1) < 0.05, lengths
    messages, _, code = _ws_session(live, pieces, speed=3.0)
    # refused at once, before audio.start (no text is sent into a session that will not speak)
    assert code == 1007 and len(messages) == 1 and messages[0]["type"] == "error", messages
    assert messages[0]["error"]["param"] == "speed" and "0.5 to 2" in messages[0]["error"]["message"]


def test_every_sentence_is_spoken_over_http_and_the_websocket(live, builtin_tts):
    """The built-in LM reads one sentence at a time (docs/text.md): the server speaks each sentence of TEXT as a
    segment of its own (seed + k), and over the WebSocket each once it is complete (seed + 1000 k), so the answer
    is as long as the three sentences spoken alone (it used to hold the first sentence or so)."""
    sentences = builtin_tts.segments(TEXT)
    assert len(sentences) == 3
    r = live.client.post("/v1/audio/speech", json={"model": "cadenza-tiny", "input": TEXT, "seed": 5,
                                                   "response_format": "pcm"})
    assert r.status_code == 200
    assert len(r.content) // 2 == sum(len(builtin_tts.synthesize(s, seed=5 + k).samples)
                                      for k, s in enumerate(sentences))
    pieces = ["Please open ", "the window. ", "The room is ", "warm today, and the air ", "feels heavy. We could ",
              "go for a walk."]
    _, audio, code = _ws_session(live, pieces, seed=3)
    assert code == 1000 and len(audio) // 2 == sum(len(builtin_tts.synthesize(s, seed=3 + 1000 * k).samples)
                                                   for k, s in enumerate(sentences))


def test_openai_voice_names_speak_with_the_default_voice(live):
    """OpenAI's clients must name one of its voices ("alloy"): such a name stands for the model's default voice, over
    HTTP and the WebSocket; any other unknown name is still a 400."""
    def pcm(**voice) -> bytes:
        r = live.client.post("/v1/audio/speech", json={"model": "tts-1", "input": SHORT, "seed": 3,
                                                        "response_format": "pcm", **voice})
        assert r.status_code == 200, r.text
        return r.content

    default = pcm()
    assert pcm(voice="alloy") == default and pcm(voice="Nova") == default
    r = live.client.post("/v1/audio/speech", json={"model": "tts-1", "input": SHORT, "voice": "alloyy"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "voice_not_found", r.text
    messages, audio, code = _ws_session(live, [SHORT], seed=3, voice="shimmer")
    assert code == 1000 and messages[0]["type"] == "audio.start" and len(audio) == len(default)


def test_a_model_without_instructions_says_so_and_refuses_them(live):
    """cadenza-tiny reads phonemes and was never trained with style instructions: /v1/models says so (the playground
    then hides the field), and a request with them is a 400 naming ``instructions`` over HTTP and the WebSocket, as
    the first thing checked; blank instructions are ignored as elsewhere."""
    caps = live.client.get("/v1/models").json()["data"][0]["capabilities"]
    assert caps["instructions"] == "none" and "instruct" not in caps["modes"] and "zero_shot" in caps["modes"]
    r = live.client.post("/v1/audio/speech", json={"model": "gpt-4o-mini-tts", "input": SHORT, "voice": "coral",
                                                   "instructions": "Speak cheerfully."})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "instructions" and error["code"] == "unsupported_value"
    assert "not trained with instructions" in error["message"]
    r = live.client.post("/v1/audio/speech", json={"model": "tts-1", "input": SHORT, "seed": 3,
                                                   "response_format": "pcm", "instructions": "  "})
    assert r.status_code == 200 and len(r.content) > 0
    messages, audio, code = _ws_session(live, [SHORT], seed=3, instructions="Speak cheerfully.")
    assert code == 1007 and audio == b"" and messages[0]["type"] == "error", messages
    assert messages[0]["error"]["param"] == "instructions", messages


def test_a_chunk_and_the_words_it_settled_go_out_in_one_write():
    """The SSE body yields one bytes object per engine chunk: the audio delta and the word events after it. As
    separate writes, a client that left mid-stream got a burst of them before uvicorn noticed the loss, and asyncio
    logged "socket.send() raised exception." for each past the fifth (13 lines in 40 s of 6 such clients)."""
    import asyncio

    from cadenza.alignment.aligner import WordTiming
    from cadenza.server.openai_speech import _sse

    words = [WordTiming("Hello", 0.0, 0.3, 0, 5), WordTiming("there.", 0.35, 0.7, 6, 12)]

    class Stream:
        samples = 4800
        calls = 0
        truncated = False

        async def map(self, step):
            Stream.calls += 1
            if Stream.calls == 1:
                pending.extend(words)  # the second chunk settles both words
                return b"\x01\x00" * 10, False
            return b"", True

    pending: list = []
    finished = []
    body = _sse(None, Stream(), None, (b"\x00\x00" * 10, False), finished.append, 3, 1920, pending)

    async def collect():
        return [part async for part in body]

    writes = asyncio.run(collect())
    kinds = [[json.loads(e[6:])["type"] for e in w.decode().split("\n\n") if e] for w in writes]
    assert kinds == [["speech.audio.delta"], ["speech.audio.delta", "speech.word", "speech.word"],
                     ["speech.audio.done"]]
    assert finished == [True]
