"""VoxCPM 2 through the server, beside a CosyVoice 2 model in the same server (real uvicorn on 127.0.0.1).

The fixture's tiny VoxCPM 2 has random weights: the audio is checked by what must hold for any weights -- the
server says exactly what the Python API says for the same text, voice and seed, at 48 kHz, in every format -- and
the contract by status codes and OpenAI-shaped errors naming the field.
"""

from __future__ import annotations

import base64
import io
import json
import threading

import httpx
import numpy as np
import pytest
import soundfile as sf
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from cadenza.audio.wav_stream import pcm16
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, LiveServer, drain_ws, speech_prompt, wav_bytes

KEY = "test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXT = "Hello there, how are you today?"
TRANSCRIPT = "Just by listening a few minutes a day."


@pytest.fixture(scope="module")
def live(vx2, cv2, tmp_path_factory):
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    app = create_app({"vx2": vx2, "cv2": cv2}, store, ServerConfig(api_key=KEY))
    with LiveServer(app) as server, httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        server.client, server.store, server.state = client, store, app.state.cadenza
        samples, sr = speech_prompt(3.0)
        for name, model, extra in (("vera", "vx2", {"transcript": TRANSCRIPT, "cloning": "combined"}),
                                   ("rita", "vx2", {}),
                                   ("carl", "cv2", {"transcript": TRANSCRIPT})):
            r = client.post("/v1/audio/voices", files={"audio": ("v.wav", wav_bytes(samples, sr), "audio/wav")},
                            data={"name": name, "consent": CONSENT, "model": model, **extra})
            assert r.status_code == 201, r.text
        yield server


def _speech(live, **fields) -> httpx.Response:
    body = {"model": "vx2", "input": TEXT, "seed": 7, "response_format": "pcm", **fields}
    return live.client.post("/v1/audio/speech", json=body)


def _error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param, err
    return err


def _pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2")


def _same_audio(actual: bytes, expected: np.ndarray) -> None:
    """The server's 16-bit PCM is the API's audio: same length, equal up to a 16-bit step or two (a request that
    shares a scheduler step with another, or runs on another thread count, sums its GEMMs in another order)."""
    a, e = _pcm(actual).astype(int), _pcm(pcm16(expected)).astype(int)
    assert a.size == e.size and np.abs(a - e).max() <= 2


def _streamed(vx2, text: str, **kwargs) -> np.ndarray:
    """What the Python API streams (the streaming decoder: within 1 LSB of a whole decode, not bit-equal)."""
    return np.concatenate(list(vx2.synthesize_stream(text, **kwargs)))


def test_models_lists_both_families_with_what_they_can_do(live, vx2, cv2):
    data = {m["id"]: m for m in live.client.get("/v1/models").json()["data"]}
    assert list(data) == ["vx2", "cv2"]
    vx, cv = data["vx2"]["capabilities"], data["cv2"]["capabilities"]
    assert (vx["family"], vx["sample_rate"], vx["speed"], vx["instructions"]) == ("voxcpm2", 48000, [0.5, 2.0],
                                                                                  "voice_design")
    assert (cv["family"], cv["sample_rate"], cv["instructions"]) == ("cosyvoice2", cv2.sample_rate, "instruct")
    assert vx["cloning_modes"] == ["reference", "continuation", "combined"] and vx["text_streaming"] == "sentences"
    assert data["vx2"]["limits"]["max_active"] == vx2.limits.max_active
    assert live.client.get("/v1/models/vx2").json()["id"] == "vx2"
    _error(live.client.get("/v1/models/nope"), 404, "model")
    health = httpx.get(f"{live.url}/health").json()
    assert [m["family"] for m in health["models"]] == ["voxcpm2", "cosyvoice2"]


def test_voice_design_by_instructions_is_what_the_python_api_says(live, vx2):
    r = _speech(live, instructions="A warm, low voice")
    assert r.status_code == 200, r.text
    assert r.headers["x-sample-rate"] == "48000" and r.headers["x-seed"] == "7"
    expected = _streamed(vx2, f"(A warm, low voice){TEXT}", seed=7)
    _same_audio(r.content, expected)
    same = _speech(live, input=f"(A warm, low voice){TEXT}")  # the description written into the input
    assert same.status_code == 200
    _same_audio(same.content, expected)
    _error(_speech(live, input=f"(calm){TEXT}", instructions="loud"), 400, "instructions")


def test_every_format_at_48_khz(live, vx2):
    for fmt in ("wav", "flac"):
        r = _speech(live, response_format=fmt, stream=False)  # whole: decoded in one call, as synthesize does
        assert r.status_code == 200, r.text
        audio, sr = sf.read(io.BytesIO(r.content), dtype="int16")
        assert sr == 48000
        _same_audio(audio.tobytes(), vx2.synthesize(TEXT, seed=7).samples)
    for fmt in ("mp3", "opus", "aac"):
        r = _speech(live, response_format=fmt)
        assert r.status_code == 200 and len(r.content) > 100, (fmt, r.text[:200])
    r = _speech(live, stream_format="sse")
    events = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: ")]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert events[-1]["type"] == "speech.audio.done"
    _same_audio(audio, _streamed(vx2, TEXT, seed=7))
    assert events[-1]["usage"]["output_tokens"] == len(audio) // 2 // 7680  # latent patches of 160 ms


def test_saved_voices_clone_as_they_were_made(live, vx2):
    for name, mode in (("vera", "combined"), ("rita", "reference")):
        voice = live.state.models["vx2"].prompts.resolve(name)
        assert voice.mode == mode and (voice.prompt.prompt_text is not None) == (mode == "combined")
        r = _speech(live, voice=name)
        assert r.status_code == 200, r.text
        _same_audio(r.content, _streamed(vx2, TEXT, voice=voice.prompt, seed=7))
    assert _speech(live, voice="rita", instructions="A bright voice").status_code == 200  # controllable cloning
    _error(_speech(live, voice="vera", instructions="A bright voice"), 400)  # a continued recording fixes the voice
    listed = {v["name"]: v["family"] for v in live.client.get("/v1/audio/voices").json()}
    assert listed == {"vera": "voxcpm2", "rita": "voxcpm2", "carl": "cosyvoice2"}


def test_a_voice_is_refused_by_the_other_family(live):
    err = _error(_speech(live, voice="carl"), 400, "voice")
    assert err["code"] == "voice_model_mismatch" and "CosyVoice 2" in err["message"]
    r = live.client.post("/v1/audio/speech", json={"model": "cv2", "input": TEXT, "voice": "vera"})
    assert _error(r, 400, "voice")["code"] == "voice_model_mismatch"


def test_fields_a_model_cannot_honour_are_named(live):
    _error(_speech(live, speed=2.5), 400, "speed")
    samples, sr = speech_prompt(2.0)
    files = {"audio": ("v.wav", wav_bytes(samples, sr), "audio/wav")}
    r = live.client.post("/v1/audio/voices", files=files, data={"name": "x1", "consent": CONSENT, "model": "cv2",
                                                                "cloning": "reference"})
    _error(r, 400, "cloning")
    r = live.client.post("/v1/audio/voices", files=files, data={"name": "x2", "consent": CONSENT, "model": "vx2",
                                                                "cloning": "continuation"})
    _error(r, 400, "cloning")
    r = live.client.post("/v1/audio/voices", files=files, data={"name": "x3", "consent": CONSENT, "model": "nope"})
    _error(r, 404, "model")
    assert {"x1", "x2", "x3"}.isdisjoint(v["name"] for v in live.client.get("/v1/audio/voices").json())


def test_voice_conversion_is_a_cosyvoice2_mode(live):
    """``/v1/audio/voice-conversion`` names the model when it is a VoxCPM 2 one, and refuses a VoxCPM 2 voice as the
    target of a CosyVoice 2 model as the speech endpoint does; a CosyVoice 2 voice converts."""
    samples, sr = speech_prompt(2.0)
    files = {"audio": ("s.wav", wav_bytes(samples, sr), "audio/wav")}
    r = live.client.post("/v1/audio/voice-conversion", files=files, data={"model": "vx2", "voice": "vera"})
    assert "no voice conversion" in _error(r, 400, "model")["message"]
    r = live.client.post("/v1/audio/voice-conversion", files=files, data={"model": "cv2", "voice": "vera"})
    assert _error(r, 400, "voice")["code"] == "voice_model_mismatch"
    r = live.client.post("/v1/audio/voice-conversion", files=files,
                         data={"model": "cv2", "voice": "carl", "response_format": "pcm", "stream": "false"})
    assert r.status_code == 200 and abs(len(r.content) / 2 / 24000 - 2.0) < 0.1, r.text


def test_live_voice_conversion_is_a_cosyvoice2_mode(live):
    """The live WebSocket refuses a VoxCPM 2 model (naming ``model``) and a VoxCPM 2 voice for a CosyVoice 2 model
    (naming ``voice``), each before any audio is taken; a CosyVoice 2 voice converts."""
    samples, sr = speech_prompt(2.0)
    mono = samples if samples.ndim == 1 else samples.mean(axis=1)
    for config, param, words in (({"model": "vx2", "voice": "vera"}, "model", "no voice conversion"),
                                 ({"model": "cv2", "voice": "vera"}, "voice", "VoxCPM 2"),
                                 ({"model": "cv2", "voice": "carl", "sample_rate": sr}, None, None)):
        with connect(f"{live.ws_url}/v1/audio/voice-conversion/stream", additional_headers=AUTH) as ws:
            ws.send(json.dumps({"type": "session.config", **config}))
            try:
                ws.send(pcm16(mono))
                ws.send(json.dumps({"type": "input.done"}))
            except ConnectionClosed:
                pass  # refused at its config: what the server sent says why
            events, audio, code = drain_ws(ws)
        if param is None:
            assert code == 1000 and events[-1]["type"] == "audio.done", events
            assert abs(len(audio) / 2 / 24000 - 2.0) < 0.1
        else:
            assert code == 1007 and events[-1]["error"]["param"] == param, events
            assert words in events[-1]["error"]["message"], events


def test_the_request_model_selects_the_model(live, cv2):
    _error(_speech(live, model="nope"), 404, "model")
    r = _speech(live, model="tts-1", voice="carl")  # OpenAI's own names: the default (first) model
    _error(r, 400, "voice")
    r = live.client.post("/v1/audio/speech", json={"model": "cv2", "input": TEXT, "voice": "carl",
                                                   "response_format": "pcm", "seed": 3})
    assert r.status_code == 200 and r.headers["x-sample-rate"] == str(cv2.sample_rate)


def test_concurrent_requests_say_what_each_says_alone(live):
    texts = [f"Number {k}: {TEXT}" for k in range(4)]
    alone = [_speech(live, input=t, seed=k).content for k, t in enumerate(texts)]
    together: list[bytes | None] = [None] * 4

    def run(k: int) -> None:
        together[k] = _speech(live, input=texts[k], seed=k).content

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Batched across requests: the same noise and decisions, numbers equal up to float rounding (GEMMs sum in another
    # order for another batch), so 16-bit samples may differ by a step.
    for a, b in zip(alone, together):
        _same_audio(b, _pcm(a) / 32767.0)


def _until_done(ws, audio: list[bytes]) -> dict:
    """Collect binary messages into ``audio`` until the first JSON message, which is returned."""
    while True:
        message = ws.recv(timeout=60)
        if not isinstance(message, bytes):
            return json.loads(message)
        audio.append(message)


def _two_sentences(live, vx2) -> np.ndarray:
    """What "Hello there. How are you today?" is, said by rita with seed 11, sentence by sentence, marked once."""
    voice = live.state.models["vx2"].prompts.resolve("rita").prompt
    # One output, one watermark across both sentences (each sentence alone would start the mark afresh).
    raw = [np.concatenate(list(vx2.engine.stream(vx2.request(text, voice=voice, seed=seed))))
           for text, seed in (("Hello there.", 11), ("How are you today?", 1011))]
    return vx2.mark.whole(np.concatenate(raw))


def test_websocket_speaks_each_sentence_once_it_is_complete(live, vx2):
    with connect(f"{live.ws_url}/v1/audio/speech/stream", additional_headers=AUTH, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.config", "model": "vx2", "voice": "rita", "seed": 11}))
        start = json.loads(ws.recv(timeout=30))
        assert start == {"type": "audio.start", "sample_rate": 48000, "format": "pcm_s16le", "seed": 11}
        ws.send(json.dumps({"type": "input.text", "text": "Hello there. How are"}))
        first = ws.recv(timeout=60)  # the first sentence is spoken before the text ends
        assert isinstance(first, bytes) and len(first) > 0
        ws.send(json.dumps({"type": "input.text", "text": " you today?"}))
        ws.send(json.dumps({"type": "input.done"}))
        audio = [first]
        done = _until_done(ws, audio)
    assert done["type"] == "audio.done"
    expected = _two_sentences(live, vx2)
    _same_audio(b"".join(audio), expected)
    assert done["audio_seconds"] == pytest.approx(expected.size / 48000, abs=1e-3)


def test_websocket_whitespace_pieces_keep_the_words_apart(live, vx2):
    """Spaces sent as pieces of their own (as LLM token streams do) are word boundaries, not nothing: the sentences
    are "Hello there." and "How are you today?", not "Hellothere." and "Howareyoutoday?"."""
    pieces = ["Hello", " ", "there.", " ", "How", " ", "are", " ", "you", " ", "today?"]
    with connect(f"{live.ws_url}/v1/audio/speech/stream", additional_headers=AUTH, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.config", "model": "vx2", "voice": "rita", "seed": 11}))
        assert json.loads(ws.recv(timeout=30))["type"] == "audio.start"
        for piece in pieces:
            ws.send(json.dumps({"type": "input.text", "text": piece}))
        ws.send(json.dumps({"type": "input.done"}))
        audio: list[bytes] = []
        done = _until_done(ws, audio)
    assert done["type"] == "audio.done"
    _same_audio(b"".join(audio), _two_sentences(live, vx2))
