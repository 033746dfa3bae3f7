"""Every output is marked: the Python API (whole and streamed), the server (HTTP and WebSocket), the CLI; the
operator can turn it off or use an own key at load time, a request cannot; ``/v1/audio/detect`` reads it back."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
import soundfile as sf

import cadenza
from cadenza.errors import InputError
from cadenza.provenance import Watermark
from cadenza.provenance.keys import DEFAULT_KEY
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore
from helpers import run_cli

from test_server_harness import LiveServer

TEXT = "Hello there, this sentence is long enough to carry the whole provenance mark and its payload."
OWN_KEY = b"an operator's own secret key, 32+"


@pytest.fixture(scope="module")
def tiny():
    with cadenza.load() as model:  # the built-in model: real speech, 24 kHz
        yield model


def _detect(audio: np.ndarray, sr: int, key: bytes = DEFAULT_KEY):
    return Watermark(key, sr).detect(audio, sr)


def test_the_api_marks_whole_and_streamed_output_alike(tiny):
    whole = tiny.synthesize(TEXT, seed=3).samples
    found = _detect(whole, tiny.sample_rate)
    assert found.found and found.raw_payload == tiny.mark.payload
    unmarked = tiny.engine.synthesize(tiny.requests(TEXT, seed=3)[0]) if len(tiny.segments(TEXT)) == 1 else None
    if unmarked is not None:
        assert not _detect(unmarked, tiny.sample_rate).found  # the model's own audio is not marked
        snr = 10 * np.log10(np.sum(unmarked**2) / np.sum((whole - unmarked) ** 2))
        assert snr >= 30  # the mark is >= 30 dB below the speech
    streamed = np.concatenate(list(tiny.synthesize_stream(TEXT, seed=3)))
    assert _detect(streamed, tiny.sample_rate).found
    again = tiny.synthesize(TEXT, seed=3).samples
    np.testing.assert_array_equal(whole, again)  # same seed, same (marked) audio


def test_short_clips_of_the_built_in_model_carry_their_payload(tiny):
    # cadenza-tiny's vocoder voices partly at multiples of 50 Hz, locked to its mel frames; folded, that repeats
    # like the mark and hid the payload of most 2-4 s clips until the detector dropped it (docs/provenance.md).
    for text in ("Could you turn the music down a little?", "The bus was late again this morning.",
                 "Thanks for letting me know so quickly."):
        audio = tiny.synthesize(text, seed=3).samples
        assert audio.size < 4.5 * tiny.sample_rate
        found = _detect(audio, tiny.sample_rate)
        assert found.found and found.payload == tiny.mark.payload, (text, found)


def test_the_operator_turns_it_off_or_uses_an_own_key():
    with cadenza.load(watermark=False) as off:
        assert not _detect(off.synthesize(TEXT, seed=3).samples, off.sample_rate).found
    with cadenza.load(watermark=OWN_KEY) as own:
        audio = own.synthesize(TEXT, seed=3).samples
        assert _detect(audio, own.sample_rate, OWN_KEY).found
        assert not _detect(audio, own.sample_rate).found  # not readable with the public key
    with pytest.raises(InputError, match="watermark"):
        cadenza.load(watermark="yes")


def test_the_server_marks_its_answers_and_detects(tiny, tmp_path):
    with VoiceStore(tmp_path / "voices") as store, LiveServer(create_app(tiny, store, ServerConfig())) as server:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            r = c.post("/v1/audio/speech", json={"model": "m", "input": TEXT, "seed": 3, "response_format": "wav",
                                                 "stream": False})
            assert r.status_code == 200
            audio, sr = sf.read(io.BytesIO(r.content), dtype="float32")
            assert _detect(audio, sr).found
            d = c.post("/v1/audio/detect", files={"audio": ("a.wav", r.content, "audio/wav")}).json()
            assert d["found"]
            if d["payload"] is not None:  # read when enough of the utterance carries it (docs/provenance.md)
                assert int(d["payload"], 16) == tiny.mark.payload and d["payload_matches"] == server_names(c)
            silence = io.BytesIO()
            sf.write(silence, np.zeros(48000, np.float32), 24000, format="WAV")
            assert not c.post("/v1/audio/detect", files={"audio": ("s.wav", silence.getvalue())}).json()["found"]
            assert c.post("/v1/audio/detect", json={}).status_code == 415
            extra = c.post("/v1/audio/speech", json={"model": "m", "input": TEXT, "watermark": False})
            assert extra.status_code == 400  # a request cannot turn the mark off


def server_names(c) -> list[str]:
    return [m["id"] for m in c.get("/v1/models").json()["data"]]


def test_the_cli_marks_and_detects(tmp_path, capsys):
    """``cadenza synth`` marks (a real process, default flags) unless ``--no-watermark``; ``cadenza detect`` (run
    in-process: the same code without another interpreter and model load) finds the mark in the one only."""
    def cli(*argv) -> tuple[int, str, str]:
        return run_cli(capsys, *argv)

    out, plain = tmp_path / "marked.wav", tmp_path / "plain.wav"
    proc = subprocess.run([sys.executable, "-m", "cadenza", "synth", "--text", TEXT, "--seed", "3", "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    code, _, err = cli("synth", "--text", TEXT, "--seed", "3", "-o", plain, "--no-watermark")
    assert code == 0, err
    code, found, _ = cli("detect", out)
    assert code == 0 and json.loads(found)["found"] is True
    _, missing, _ = cli("detect", plain)
    assert json.loads(missing)["found"] is False
    code, _, err = cli("synth", "--text", TEXT, "-o", tmp_path / "x.wav", "--no-watermark", "--watermark-key-file", out)
    assert code == 2 and "contradict" in err


def test_every_speaking_command_takes_the_operator_flags(tmp_path):
    from test_server_harness import speech_prompt

    samples, sr = speech_prompt(3.0)
    prompt = tmp_path / "prompt.wav"
    sf.write(prompt, samples, sr)
    out = tmp_path / "cloned.wav"
    proc = subprocess.run([sys.executable, "-m", "cadenza", "clone", "--reference-wav", str(prompt), "--text", TEXT,
                           "--seed", "2", "--no-watermark", "--dtype", "float32", "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    audio, rate = sf.read(out, dtype="float32")
    assert not _detect(audio, rate).found
    for command in ("design", "vc"):
        helptext = subprocess.run([sys.executable, "-m", "cadenza", command, "--help"], capture_output=True,
                                  text=True, timeout=60).stdout
        assert "--no-watermark" in helptext and "--dtype" in helptext
