"""SSML and pronunciation lexicons over the WebSocket (``/v1/audio/speech/stream``), live on loopback, both families.

Random weights make noise, so the audio is checked by what holds for any weights: an SSML document sent over the
socket is exactly the audio ``POST /v1/audio/speech`` makes of it with the same seed (the same planning code), its
breaks runs of exactly ``round(ms * sample_rate / 1000)`` zero samples; a lexicon gives exactly the audio of the
respelled text; a bad document is refused with the HTTP 400's code and wording and the session goes on.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, LiveServer, drain_ws, speech_prompt, wait_until, wav_bytes

KEY = "ws-markup-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
TRANSCRIPT = "Just by listening a few minutes a day."
LEXICON = [{"word": "Cadenza", "respelling": "ka den za"}, {"word": "SQL", "respelling": "sequel",
                                                             "case_sensitive": True}]


@pytest.fixture(scope="module")
def live(cv2, vx2, tmp_path_factory):
    app = create_app({"cv2": cv2, "vx2": vx2}, VoiceStore(tmp_path_factory.mktemp("voices")), ServerConfig(api_key=KEY))
    with LiveServer(app) as server, httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        samples, sr = speech_prompt(3.0)
        r = client.post("/v1/audio/voices", files={"audio": ("v.wav", wav_bytes(samples, sr), "audio/wav")},
                        data={"name": "carl", "consent": CONSENT, "model": "cv2", "transcript": TRANSCRIPT})
        assert r.status_code == 201, r.text
        server.client, server.models = client, (cv2, vx2)
        yield server


def _session(live, texts: list, **config) -> tuple[list[dict], bytes, int | None]:
    """One WebSocket session: config, each text (a string, or a dict of input.text fields), input.done; (JSON
    messages, audio bytes, close code)."""
    # A session that failed may still be leaving the engine; batched with it, the next one's audio could differ in
    # the last bit. Start each session on an idle engine.
    assert wait_until(lambda: all(m.load == (0, 0) for m in getattr(live, "models", ())))
    messages, audio = [], b""
    with connect(f"{live.ws_url}/v1/audio/speech/stream", additional_headers=AUTH, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.config", **config}))
        try:
            messages.append(json.loads(ws.recv(timeout=60)))
            for text in texts:
                ws.send(json.dumps({"type": "input.text", **({"text": text} if isinstance(text, str) else text)}))
            ws.send(json.dumps({"type": "input.done"}))
        except ConnectionClosed as closed:
            return messages, audio, closed.rcvd.code if closed.rcvd else None
        events, audio, code = drain_ws(ws)
        return messages + events, audio, code


def _http(live, text: str, seed: int, **fields) -> httpx.Response:
    body = {"model": "cv2", "voice": "carl", "input": text, "seed": seed, "response_format": "pcm", **fields}
    return live.client.post("/v1/audio/speech", json=body)


def _http_pcm(live, text: str, seed: int, **fields) -> bytes:
    r = _http(live, text, seed, **fields)
    assert r.status_code == 200, r.text
    return r.content


def _zero_runs(pcm: bytes, shortest: int = 50) -> list[int]:
    """Lengths of the runs of exact zeros at least ``shortest`` samples long (only an inserted silence is long)."""
    x = np.frombuffer(pcm, "<i2")
    edges = np.flatnonzero(np.diff(np.concatenate([[0], (x == 0).astype(np.int8), [0]])))
    return [int(b - a) for a, b in zip(edges[::2], edges[1::2], strict=True) if b - a >= shortest]


def _errors(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["type"] == "error"]


@pytest.mark.parametrize("model", ["cv2", "vx2"])
def test_an_ssml_document_is_the_http_audio_with_exact_breaks_and_its_words(live, cv2, vx2, model):
    sr = {"cv2": cv2, "vx2": vx2}[model].sample_rate
    doc = '<speak>Hi there.<break time="500ms"/>Bye.</speak>'
    voice = {"voice": "carl" if model == "cv2" else None}
    messages, audio, code = _session(live, [doc], model=model, seed=3, timestamps=True, **voice)
    assert code == 1000 and messages[-1]["type"] == "audio.done" and not _errors(messages), messages
    assert _zero_runs(audio) == [sr // 2]  # 0.5 s of exact zeros, to the sample
    assert audio == _http_pcm(live, doc, 3, model=model, **voice)  # the HTTP request's own planning and audio
    words = [m for m in messages if m["type"] == "word"]
    assert [(w["word"], doc[w["start_char"]:w["end_char"]]) for w in words] == [
        ("Hi", "Hi"), ("there.", "there."), ("Bye.", "Bye.")]  # no tag is a word; places in the text as sent
    ends = [0.0] + [t for w in words for t in (w["start"], w["end"])]
    assert ends == sorted(ends) and ends[-1] <= len(audio) / 2 / sr + 1e-6


def test_documents_follow_each_other_and_a_bad_one_is_refused_alone(live):
    first, second = '<speak>Hi there.<break time="250ms"/>Good day.</speak>', "<speak>Cadenza speaks SQL.</speak>"
    bad_tag = "<speak>Hi <audio src='x.wav'/></speak>"
    texts = [first, "<speak>Hello ", bad_tag, "Plain text.", {"text": second, "lexicon": LEXICON}]
    messages, audio, code = _session(live, texts, model="cv2", voice="carl", seed=5)
    assert code == 1000 and messages[-1]["type"] == "audio.done", messages
    partial, tag, plain = _errors(messages)
    assert all(e["fatal"] is False and e["error"]["code"] == "invalid_ssml" and e["error"]["param"] == "text"
               for e in (partial, tag, plain))
    assert partial["error"]["message"] == ("incomplete SSML at line 1, column 14: the text ends before </speak> "
                                           "(the <speak> at line 1, column 1); SSML is read as one whole <speak> "
                                           "document")
    http = _http(live, bad_tag, 5).json()["error"]
    assert tag["error"]["message"] == http["message"] and http["code"] == "invalid_ssml"
    assert "SSML <audio> at line 1, column 11: unsupported tag" in http["message"]
    assert "SSML at line 1, column 1: text before the root element" in plain["error"]["message"]
    # The refused documents say nothing: the audio is the two good ones, document k with seed + 1000 k.
    one, two = _http_pcm(live, first, 5), _http_pcm(live, "ka den za speaks sequel.", 1005)
    assert len(audio) == len(one) + len(two) and audio[: len(one)] == one
    # The second document's samples carry the session's provenance mark where it had got to, the HTTP answer a
    # mark started afresh: the same speech under a faint, different mark (another seed's speech differs wholly).
    said, alone = np.frombuffer(audio[len(one):], "<i2").astype(float), np.frombuffer(two, "<i2").astype(float)
    assert np.sqrt(np.mean((said - alone) ** 2)) < 0.1 * np.sqrt(np.mean(alone ** 2))
    assert _http_pcm(live, second, 1005, lexicon=LEXICON) == _http_pcm(live, "ka den za speaks sequel.", 1005)
    assert _zero_runs(audio) == [6000]


def test_only_refused_documents_is_nothing_to_speak(live):
    messages, audio, code = _session(live, ["<speak>Hi <emphasis>there"], model="cv2", voice="carl",
                                     input_format="ssml")
    first, last = _errors(messages)
    assert first["fatal"] is False and last["fatal"] is True and code == 1007 and audio == b""
    assert last["error"]["message"].startswith("nothing to speak before input.done: every SSML document was "
                                               "refused (the last: incomplete SSML at line 1, column 26")


def _bistream(live, pieces: list[str], **config) -> tuple[int, bytes]:
    """(seed, audio) of a bi-streamed session: the first seed from 1 whose random-weight LM does not emit a special
    token mid-text (which the engine reports as an error)."""
    for seed in range(1, 12):
        messages, audio, code = _session(live, pieces, model="cv2", voice="carl", seed=seed, **config)
        if code == 1000:
            return seed, audio
    raise AssertionError(messages)


def test_a_lexicon_applies_to_streamed_text_the_voices_too(live):
    respelled = ["ka den za ", "speaks ", "sequel."]
    seed, plain = _bistream(live, respelled)
    assert _session(live, ["Cadenza ", "speaks ", "SQL."], model="cv2", voice="carl", seed=seed,
                    lexicon=LEXICON)[1] == plain
    # The saved voice's lexicon applies over the WebSocket too; the session's entries win over it.
    assert live.client.put("/v1/audio/voices/carl/lexicon", json={"entries": LEXICON}).status_code == 200
    try:
        assert _session(live, ["Cadenza ", "speaks ", "SQL."], model="cv2", voice="carl", seed=seed)[1] == plain
        s2, spelled = _bistream(live, ["ka den za ", "speaks ", "S Q L."])
        override = _session(live, ["Cadenza ", "speaks ", "SQL."], model="cv2", voice="carl", seed=s2,
                            lexicon=[{"word": "SQL", "respelling": "S Q L"}])
        assert override[1] == spelled
    finally:
        live.client.delete("/v1/audio/voices/carl/lexicon")


def test_voxcpm2_lexicon_on_streamed_text(live):
    said = _session(live, ["Cadenza ", "now."], model="vx2", seed=4, lexicon=LEXICON)
    plain = _session(live, ["ka den za ", "now."], model="vx2", seed=4)
    assert said[2] == plain[2] == 1000 and said[1] == plain[1] and len(said[1]) > 0


@pytest.mark.parametrize(("config", "texts", "param", "match"), [
    ({"lexicon": [{"word": "x"}]}, ["Hi."], "lexicon", "lexicon entry 0: entry 'x' needs exactly one of"),
    ({"lexicon": [{"word": "Cadenza", "phonemes": "kədˈɛnzə"}]}, ["Hi Cadenza ", "now."], "lexicon",
     "'Cadenza' gives phonemes, but this model reads text"),
    ({}, [{"text": "Hi.", "input_format": "xml"}], "input_format", "input_format must be 'text' or 'ssml'"),
    ({}, ["Hi ", {"text": "<speak>Hi.</speak>", "input_format": "ssml"}], "input_format",
     "this session streams plain text"),
    ({}, [{"text": "Hi ", "lexicon": LEXICON}], "lexicon", "for streamed text give it in session.config"),
    ({"input_format": "ssml"}, ["<speak>Hi.</speak>", {"text": "Bye.", "input_format": "text"}], "input_format",
     "this session speaks SSML documents"),
])
def test_protocol_errors_close_the_session(live, cv2, config, texts, param, match):
    messages, _, code = _session(live, texts, model="cv2", voice="carl", seed=1, **config)
    error = _errors(messages)[-1]
    assert code == 1007 and error["fatal"] is True and error["error"]["param"] == param, messages
    assert match in error["error"]["message"]
    assert wait_until(lambda: cv2.engine.scheduler.load == (0, 0))


def test_real_speech_words_around_a_break(builtin_tts, tmp_path):
    """The built-in model (real speech, the aligner's own voice): words before a break end before its silence and
    the words after it start after it."""
    doc = '<speak>Please open the window.<break time="700ms"/>The room is warm.</speak>'
    app = create_app(builtin_tts, VoiceStore(tmp_path / "voices"), ServerConfig(api_key=KEY))
    with LiveServer(app) as server:
        messages, audio, code = _session(server, [doc], seed=2, timestamps=True)
    sr = builtin_tts.sample_rate
    assert code == 1000 and not _errors(messages), messages
    x = np.frombuffer(audio, "<i2")
    edges = np.flatnonzero(np.diff(np.concatenate([[0], (x == 0).astype(np.int8), [0]])))
    (start, length), = [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2], strict=True) if b - a >= 50]
    assert 0 <= length - round(0.7 * sr) <= sr // 1000  # real speech: a quiet sample beside it may round to 0
    words = {w["word"]: w for w in messages if w["type"] == "word"}
    assert list(words) == ["Please", "open", "the", "window.", "The", "room", "is", "warm."]
    silence = (start / sr, (start + length) / sr)
    assert words["window."]["end"] <= silence[0] + 0.05 and words["The"]["start"] >= silence[1] - 0.05, (words, silence)
    assert doc[words["The"]["start_char"]:words["The"]["end_char"]] == "The"
