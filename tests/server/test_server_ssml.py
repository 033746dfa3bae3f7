"""SSML and pronunciation lexicons end to end: the Python API and a live server on loopback, for both families.

Random weights make noise, so the audio is checked by what must hold for any weights: a break is a run of exactly
``round(ms * sample_rate / 1000)`` zero samples at its place, streamed and whole alike; markup that expands to text
(say-as, a lexicon entry, emphasis, a prosody rate) gives exactly the audio of that text said plainly with the same
seed; bad markup is a 400 naming the tag and its line and column.
"""

from __future__ import annotations

import io
import json
import sqlite3

import httpx
import numpy as np
import pytest
import soundfile as sf

import cadenza
from cadenza import Cadenza
from cadenza.cli.main import main as cli_main
from cadenza.errors import InputError
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, LiveServer, speech_prompt, wav_bytes

KEY = "test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
TRANSCRIPT = "Just by listening a few minutes a day."
BREAKS = '<speak>Hi there.<break time="250ms"/>Good day.<break strength="strong"/>Bye.</speak>'


@pytest.fixture(scope="module")
def live(cv2, vx2, tmp_path_factory):
    folder = tmp_path_factory.mktemp("voices")
    store = VoiceStore(folder)
    app = create_app({"cv2": cv2, "vx2": vx2}, store, ServerConfig(api_key=KEY))
    with LiveServer(app) as server, httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        server.client, server.store, server.folder = client, store, folder
        samples, sr = speech_prompt(3.0)
        r = client.post("/v1/audio/voices", files={"audio": ("v.wav", wav_bytes(samples, sr), "audio/wav")},
                        data={"name": "carl", "consent": CONSENT, "model": "cv2", "transcript": TRANSCRIPT})
        assert r.status_code == 201, r.text
        server.carl = r.json()["id"]
        yield server


def _speech(live, **fields) -> httpx.Response:
    body = {"model": "cv2", "voice": "carl", "seed": 3, "response_format": "pcm", "stream": False, **fields}
    return live.client.post("/v1/audio/speech", json=body)


def _pcm(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, dtype="<i2")


def _zero_runs(x: np.ndarray, shortest: int = 50) -> list[tuple[int, int]]:
    """(start, length) of every run of exact zeros at least ``shortest`` long (a waveform crosses zero in a sample
    or two; only an inserted silence is long)."""
    zero = np.concatenate([[0], (x == 0).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(zero))
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2], strict=True) if b - a >= shortest]


def _error(r: httpx.Response, param: str | None) -> str:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    return err["message"]


# -- breaks: exact silence ---------------------------------------------------------------------------------------------
def test_python_api_breaks_are_exact_zeros_whole_and_streamed(cv2):
    sr = cv2.sample_rate
    expected = [round(250 * sr / 1000), round(750 * sr / 1000)]  # strength="strong": 750 ms
    for audio in (cv2.synthesize(BREAKS, seed=5).samples, np.concatenate(list(cv2.synthesize_stream(BREAKS, seed=5)))):
        runs = _zero_runs(audio)
        assert [n for _, n in runs] == expected, runs
        assert int((audio == 0).sum()) == sum(expected)  # float output: no other sample is exactly zero
        assert runs[0][0] > 0 and runs[1][0] > runs[0][0] + expected[0]  # between the sentences, in order


def test_server_breaks_are_exact_zeros_streamed_and_whole(live, cv2, vx2):
    short = '<speak>Hi.<break time="250ms"/>Bye.</speak>'  # VoxCPM 2's random weights speak long: keep it short
    for model, tts, voice, text in (("cv2", cv2, "carl", BREAKS), ("vx2", vx2, None, short)):
        expected = [round(250 * tts.sample_rate / 1000), round(750 * tts.sample_rate / 1000)][: text.count("<break")]
        streamed = _pcm(_speech(live, model=model, voice=voice, input=text, stream=True))
        r = _speech(live, model=model, voice=voice, input=text, response_format="wav")
        assert r.status_code == 200, r.text
        whole, sr = sf.read(io.BytesIO(r.content), dtype="int16")
        assert sr == tts.sample_rate
        for audio in (streamed, whole):  # int16: a quiet sample may round to 0, but never 50 in a row
            assert [n for _, n in _zero_runs(audio)] == expected, model


# -- markup that is text said plainly -------------------------------------------------------------------------------------
def test_ssml_is_the_audio_of_its_expansion(live):
    ssml = ('<speak>I have <say-as interpret-as="cardinal">2024</say-as> cats, call <say-as '
            'interpret-as="telephone">555-0134</say-as>. Say <sub alias="World Wide Web">WWW</sub>, '
            '<emphasis>now</emphasis>.</speak>')
    plain = ("I have two thousand twenty-four cats, call five five five, zero one three four. Say World Wide Web, "
             "<strong>now</strong>.")
    assert np.array_equal(_pcm(_speech(live, input=ssml)), _pcm(_speech(live, input=plain)))


def test_prosody_rate_is_the_model_speed(live):
    rated = _pcm(_speech(live, input='<speak><prosody rate="x-slow">Hi there.</prosody></speak>', speed=1.6))
    assert np.array_equal(rated, _pcm(_speech(live, input="Hi there.", speed=0.8)))  # x-slow = 0.5, x 1.6


def test_detection_and_explicit_formats(live):
    ssml = '<speak>Hello <break time="100ms"/> there.</speak>'
    assert [n for _, n in _zero_runs(_pcm(_speech(live, input=ssml)))] == [2400]  # auto-detected
    assert _zero_runs(_pcm(_speech(live, input=ssml, input_format="text"))) == []  # read as text: no pause
    message = _error(_speech(live, input="Hello there.", input_format="ssml"), "input")
    assert "SSML at line 1, column 1: text before the root element" in message
    _error(_speech(live, input="Hello", input_format="xml"), "input_format")


@pytest.mark.parametrize("ssml, model, message", [
    ("<speak>Hi <audio src='x.wav'/></speak>", "cv2", "SSML <audio> at line 1, column 11: unsupported tag"),
    ("<speak>Hi\n<prosody pitch='high'>x</prosody></speak>", "cv2",
     "SSML <prosody pitch> at line 2, column 1: unsupported attribute"),
    ("<speak>Hi <emphasis>there</speak>", "cv2", "malformed SSML at line 1, column 28: mismatched tag"),
    ("<speak><phoneme ph='kə'>x</phoneme></speak>", "cv2", "SSML <phoneme> at line 1, column 8: this model reads "
     "text, not phonemes"),
    ("<speak><phoneme ph='kə'>x</phoneme></speak>", "vx2", "SSML <phoneme> at line 1, column 8"),
    ("<speak><prosody rate='300%'>x</prosody></speak>", "cv2", "SSML <prosody> at line 1, column 8: rate '300%'"),
    ("<speak><lang xml:lang='fr'>oui</lang></speak>", "vx2", "SSML <lang> at line 1, column 8: xml:lang 'fr'"),
])
def test_bad_ssml_is_a_400_naming_the_tag_and_where(live, ssml, model, message):
    voice = "carl" if model == "cv2" else None
    assert message in _error(_speech(live, model=model, voice=voice, input=ssml), "input")


# -- lexicons ----------------------------------------------------------------------------------------------------------
LEXICON = [{"word": "Cadenza", "respelling": "ka den za"}, {"word": "SQL", "respelling": "sequel",
                                                             "case_sensitive": True}]


def test_request_lexicon_is_the_audio_of_the_respelled_text(live, cv2):
    said = _pcm(_speech(live, input="Cadenza speaks SQL, not sql.", lexicon=LEXICON))
    assert np.array_equal(said, _pcm(_speech(live, input="ka den za speaks sequel, not sql.")))
    message = _error(_speech(live, input="Hi Cadenza", lexicon=[{"word": "Cadenza", "phonemes": "kədˈɛnzə"}]),
                     "lexicon")
    assert "'Cadenza' gives phonemes, but this model reads text" in message
    assert "lexicon entry 1: word holds '<'" in _error(
        _speech(live, input="Hi", lexicon=[LEXICON[0], {"word": "<b>", "respelling": "x"}]), "lexicon")
    # The Python API: the same lexicon, the same words.
    a = cv2.synthesize("Cadenza.", lexicon=LEXICON, seed=2, normalize=True).samples
    np.testing.assert_array_equal(a, cv2.synthesize("ka den za.", seed=2).samples)
    with pytest.raises(InputError, match="text_ids cannot be combined"):
        cv2.synthesize(text_ids=[1, 2, 3], lexicon=LEXICON)


def test_voice_lexicon_is_stored_with_the_voice(live, cv2, tmp_path, capsys):
    client = live.client
    assert client.get("/v1/audio/voices/carl/lexicon").json()["entries"] == []
    r = client.put("/v1/audio/voices/carl/lexicon", json={"entries": LEXICON})
    assert r.status_code == 200, r.text
    assert r.json() == {"object": "audio.voice.lexicon", "voice_id": live.carl, "entries": LEXICON}
    assert client.get(f"/v1/audio/voices/{live.carl}/lexicon").json()["entries"] == LEXICON
    plain = _pcm(_speech(live, input="ka den za speaks sequel."))
    assert np.array_equal(_pcm(_speech(live, input="Cadenza speaks SQL.")), plain)  # the voice's lexicon applies
    # The Python API over the same voice store (the same engine): speaker="carl" brings the lexicon along.
    api = Cadenza(cv2.engine, cv2.directory, voices=live.store)
    np.testing.assert_array_equal(api.synthesize("Cadenza speaks SQL.", speaker="carl", seed=3).samples,
                                  api.synthesize("ka den za speaks sequel.", speaker="carl", seed=3).samples)
    override = [{"word": "cadenza", "respelling": "ka den za"}, {"word": "SQL", "respelling": "S Q L"}]
    assert np.array_equal(_pcm(_speech(live, input="Cadenza speaks SQL.", lexicon=override[1:])),
                          _pcm(_speech(live, input="ka den za speaks S Q L.")))  # the request's entry wins

    bad = client.put("/v1/audio/voices/carl/lexicon", json={"entries": [{"word": "x"}]})
    assert "entries entry 0: entry 'x' needs exactly one of" in _error(bad, "entries")
    assert client.put("/v1/audio/voices/nobody/lexicon", json={"entries": LEXICON}).status_code == 404
    assert client.put("/v1/audio/voices/carl/lexicon", json={"entries": [{"word": f"w{i}", "respelling": "x"}
                                                                          for i in range(1001)]}).status_code == 400

    # `cadenza voices lexicon`: the same lexicon, offline.
    path = tmp_path / "lex.json"
    path.write_text(json.dumps({"entries": override}))
    assert cli_main(["voices", "--voices-dir", str(live.folder), "lexicon", "carl", "--set", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == override
    assert client.get("/v1/audio/voices/carl/lexicon").json()["entries"] == override
    assert cli_main(["voices", "--voices-dir", str(live.folder), "lexicon", "carl", "--clear"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == []

    # Deleting the voice deletes its lexicon (same transaction).
    client.put("/v1/audio/voices/carl/lexicon", json={"entries": LEXICON})
    samples, sr = speech_prompt(3.0)
    r = client.post("/v1/audio/voices", files={"audio": ("v.wav", wav_bytes(samples, sr), "audio/wav")},
                    data={"name": "dora", "consent": CONSENT, "model": "cv2", "transcript": TRANSCRIPT})
    dora = r.json()["id"]
    client.put(f"/v1/audio/voices/{dora}/lexicon", json={"entries": LEXICON})
    assert client.delete(f"/v1/audio/voices/{dora}").status_code == 200
    with sqlite3.connect(live.folder / "voices.sqlite3") as db:  # the table itself, not the store's view of it
        assert db.execute("SELECT voice_id FROM voice_lexicons").fetchall() == [(live.carl,)]


def test_phonemes_reach_a_model_that_reads_them():
    """cadenza-tiny reads espeak-ng phonemes: <phoneme> and phoneme lexicon entries become its input symbols."""
    from cadenza.api import markup

    with cadenza.load() as tiny:
        doc = '<speak>Hello <phoneme ph="kədˈɛnzə">Cadenza</phoneme>.<break time="100ms"/>Yes <emphasis>A</emphasis>.</speak>'
        script = markup.make_script(tiny, doc, lexicon=markup.as_lexicon([{"word": "yes", "phonemes": "jˈɛs"}]))
        assert [type(item).__name__ for item in script] == ["Run", "Pause", "Run"]
        frontend, symbols = tiny.engine.frontend, tiny.engine.frontend.tokenizer.table.symbols
        said = ["".join(symbols[i] for i in frontend.text_ids(s)[0].tolist()) for item in script
                if isinstance(item, markup.Run) for s in item.segments]
        assert said == ["həlˈoʊ kədˈɛnzə.", "jˈɛs ˈeɪ."]  # no emphasis tags for a model that never saw them
        with pytest.raises(InputError, match=r"<lang> at line 1, column 8: xml:lang 'zh'"):
            tiny.synthesize('<speak><lang xml:lang="zh">你好</lang></speak>')


def test_cli_synth_ssml_and_lexicon(cv2, tmp_path, capsys):
    out, lexicon = tmp_path / "out.wav", tmp_path / "lex.json"
    lexicon.write_text(json.dumps({"entries": [{"word": "x", "respelling": "<b>"}]}))
    assert cli_main(["synth", "--model", str(cv2.directory), "--text", "Hi x", "--lexicon", str(lexicon),
                     "-o", str(out)]) != 0  # refused before the model loads
    assert "lexicon file" in capsys.readouterr().err and not out.exists()
    lexicon.write_text(json.dumps(LEXICON))
    assert cli_main(["synth", "--model", str(cv2.directory), "--ssml", "--text", "Cadenza.<break time='50ms'/>SQL.",
                     "--lexicon", str(lexicon), "--seed", "4", "-o", str(out)]) != 0  # --ssml: the root is <speak>
    assert "SSML at line 1, column 1: text before the root element" in capsys.readouterr().err
    assert cli_main(["synth", "--model", str(cv2.directory), "--ssml", "--text",
                     "<speak>Cadenza.<break time='50ms'/>SQL.</speak>", "--lexicon", str(lexicon), "--seed", "4",
                     "-o", str(out)]) == 0
    audio, sr = sf.read(out, dtype="int16")
    assert [n for _, n in _zero_runs(audio)] == [round(50 * sr / 1000)]
