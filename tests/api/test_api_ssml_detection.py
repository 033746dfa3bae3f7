"""SSML detection where text comes in (the Python API and ``cadenza synth``), on the toy CosyVoice 2: a document after a
byte-order mark (what Windows editors write) or a blank line before ``<?xml ...?>`` is spoken exactly as the bare
document, never its tags read aloud; text in pieces that starts as SSML is refused (a document is parsed whole) unless
``input_format="text"``; and the CLI's refusals name its own options."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from cadenza import Cadenza, CadenzaError
from cadenza.cli import main as cli
from cadenza.errors import InputError

from test_server_harness import speech_prompt
from toy_model import build_toy_model_dir

TRANSCRIPT = "Just by listening a few minutes a day."
DOC = '<speak>Hello <break time="250ms"/> there.</speak>'
WHOLE = "SSML is read as one whole document"


@pytest.fixture(scope="module")
def toy_dir(cv2_dir, tmp_path_factory):
    return build_toy_model_dir(cv2_dir, tmp_path_factory.mktemp("toy") / "model")


@pytest.fixture(scope="module")
def tts(toy_dir) -> Cadenza:
    with Cadenza.from_pretrained(toy_dir) as model:
        yield model


def _voice() -> dict:
    return {"prompt_wav": speech_prompt(), "prompt_text": TRANSCRIPT}


@pytest.mark.parametrize("text", ["\ufeff" + DOC, '\n<?xml version="1.0"?>\n' + DOC])
def test_a_bom_or_a_blank_line_before_the_declaration_speaks_the_document(tts, text):
    bare = tts.synthesize(DOC, seed=3, **_voice()).samples
    np.testing.assert_array_equal(tts.synthesize(text, seed=3, **_voice()).samples, bare)
    np.testing.assert_array_equal(np.concatenate(list(tts.synthesize_stream(text, seed=3, **_voice()))),
                                  np.concatenate(list(tts.synthesize_stream(DOC, seed=3, **_voice()))))


@pytest.mark.parametrize("pieces", [["<speak>Hello there, ", "my friend.</speak>"], ["\ufeff<spe", "ak>Hi</speak>"]])
def test_ssml_in_pieces_is_refused_not_read_aloud(tts, pieces):
    with pytest.raises(InputError, match=f"{WHOLE}, and these text pieces start with <speak>"):
        list(tts.synthesize_stream(iter(pieces), seed=1, **_voice()))
    with pytest.raises(InputError, match=f"{WHOLE}, and these text pieces start with <speak>"):
        list(tts.synthesize_stream(iter(pieces), seed=1, timestamps=True, **_voice()))
    with pytest.raises(InputError, match=f"{WHOLE}, and these text pieces start with <speak>"):
        list(tts.synthesize_stream(iter(pieces), seed=1, lexicon=[{"word": "Hi", "respelling": "hey"}], **_voice()))


def test_input_format_text_reads_pieces_that_start_with_speak_as_text(tts):
    for seed in range(1, 12):  # the random-weight LM may emit a special token mid-text for a seed (an error)
        try:
            audio = list(tts.synthesize_stream(iter(["<speak>Hello ", "there.</speak>"]), input_format="text",
                                               seed=seed, **_voice()))
        except CadenzaError as exc:
            assert WHOLE not in str(exc)
            continue
        assert sum(len(a) for a in audio) > 0
        return
    raise AssertionError("no seed speaks the pieces")


def test_cli_ssml_file_with_a_bom_is_spoken_as_the_document(toy_dir, tmp_path, capsys):
    bare, bom = tmp_path / "bare.ssml", tmp_path / "bom.ssml"
    bare.write_text(DOC + "\n", encoding="utf-8")
    bom.write_bytes(b"\xef\xbb\xbf" + bare.read_bytes())
    for flags in ([], ["--ssml"]):
        args = ["synth", "--model", str(toy_dir), "--seed", "2", *flags]
        assert cli.main([*args, "--text-file", str(bare), "-o", str(tmp_path / "bare.wav")]) == 0
        assert cli.main([*args, "--text-file", str(bom), "-o", str(tmp_path / "bom.wav")]) == 0, capsys.readouterr()
        np.testing.assert_array_equal(sf.read(tmp_path / "bom.wav", dtype="int16")[0],
                                      sf.read(tmp_path / "bare.wav", dtype="int16")[0])


def test_cli_refusals_name_the_clis_options(toy_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out.wav"
    # Plain text given as SSML: refused before the model loads, naming --ssml (the CLI has no input_format).
    assert cli.main(["synth", "--model", str(tmp_path / "no-model"), "--ssml", "--text", "\ufeffHello.",
                     "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "SSML at line 1, column 1: text before the root element (SSML starts with <speak>; drop --ssml to read " \
           "plain text)" in err and "input_format" not in err
    # SSML piped into --text-stream: refused, not spoken as "speak ... speak".
    monkeypatch.setattr(cli, "_stdin_pieces", lambda: iter(["<speak>Hello there, ", "my friend.</speak>\n"]))
    assert cli.main(["synth", "--model", str(toy_dir), "--text-file", "-", "--text-stream", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{WHOLE}, and these text pieces start with <speak>" in err and "without --text-stream" in err
    assert not out.exists()


def test_a_prosody_rate_outside_the_model_s_range_names_the_tag(tts):
    """``<prosody rate="50%">`` at speed 0.5 asks for 0.25: refused naming the tag and both factors (it was "speed must
    be between 0.5 and 2.0, got 0.25", a speed the caller never gave, with no field named over HTTP)."""
    with pytest.raises(InputError, match=r"<prosody rate> 0.5 at speed 0.5 is a speaking rate of 0.25"):
        tts.synthesize("<speak><prosody rate='50%'>Hi there.</prosody></speak>", speed=0.5, **_voice())
