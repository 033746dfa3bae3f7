"""A saved voice's lexicon is checked against the models that speak the voice when it is saved (real uvicorn on
loopback, the built-in phoneme model): an entry the model cannot read is a 400 naming it, never a stored lexicon that
makes the voice's later requests fail on that word."""

from __future__ import annotations

import httpx
import pytest

import cadenza
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, LiveServer, api_error, speech_prompt, wav_bytes

SPEECH = {"model": "tts-1", "voice": "alice", "response_format": "pcm", "seed": 1}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tts = cadenza.load()
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    config = ServerConfig()
    with LiveServer(create_app(tts, store, config), config) as server:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            samples, sr = speech_prompt(4.0)
            r = client.post("/v1/audio/voices", files={"audio": ("a.wav", wav_bytes(samples, sr), "audio/wav")},
                            data={"name": "alice", "consent": CONSENT})
            assert r.status_code == 201, r.text
            server.client = client
            yield server
    tts.close()


@pytest.mark.parametrize(("entry", "says"), [
    ({"word": "Cadenza", "phonemes": "☃"}, "phoneme symbol '☃'"),
    ({"word": "hello", "respelling": "你好"}, "another script"),
])
def test_an_entry_the_model_cannot_read_is_refused_when_saved(live, entry, says):
    c = live.client
    before = c.post("/v1/audio/speech", json={**SPEECH, "input": f"Say {entry['word']} now."})
    assert before.status_code == 200
    err = api_error(c.put("/v1/audio/voices/alice/lexicon", json={"entries": [entry]}), 400, "entries")
    assert err["code"] == "invalid_lexicon" and f"entry {entry['word']!r}" in err["message"] and says in err["message"]
    assert c.get("/v1/audio/voices/alice/lexicon").json()["entries"] == []  # nothing stored
    after = c.post("/v1/audio/speech", json={**SPEECH, "input": f"Say {entry['word']} now."})
    assert after.status_code == 200 and after.content == before.content


def test_a_readable_lexicon_is_saved_and_spoken(live):
    c = live.client
    entries = [{"word": "Cadenza", "phonemes": "kədˈɛnzə"}, {"word": "SQL", "respelling": "sequel"}]
    r = c.put("/v1/audio/voices/alice/lexicon", json={"entries": entries})
    assert r.status_code == 200, r.text
    said = c.post("/v1/audio/speech", json={**SPEECH, "input": "Cadenza speaks SQL."})
    plain = c.post("/v1/audio/speech", json={**SPEECH, "input": "Cadenza speaks sequel."})
    assert said.status_code == plain.status_code == 200 and said.content == plain.content
    assert c.delete("/v1/audio/voices/alice/lexicon").status_code == 200
