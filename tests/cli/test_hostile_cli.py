"""The hostile-input sweep of the ``cadenza`` command line (issue #19): synth / clone / design / vc / speakers /
serve arguments, texts, audio files, output paths and voice stores. Each hostile input gives exit code 2 and one
``error: ...`` line naming the argument or file, never a traceback, and nothing half-written (docs/hostile_input.md).
The CLI runs in-process against one loaded built-in model (tests/cli/conftest.py); two cases run as real subprocesses.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
import torch

import cadenza.api
import cadenza.api.audio
from cadenza.errors import CadenzaError, InputError
from hostile_entry_points import SR, TEXT, one_error_line


# --------------------------------------------------------------------------------------------------------------
# CLI: synth / clone / design / vc / speakers
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, message", [
    ("", "error: text is empty"),
    ("  \n\t ", "error: text is empty"),
    ("a\x00b", "error: --text contains a NUL character at character 1"),
    ("hi \udcff there", "error: --text is not valid Unicode: a lone surrogate U+DCFF at character 3 (is the command "
                        "line in UTF-8?)"),
    ("...!!!", "error: text has nothing to speak"),
])
def test_synth_hostile_text(cli, tmp_path, text, message):
    out = tmp_path / "x.wav"
    code, _, err = cli("synth", "--text", text, "-o", out)
    assert code == 2 and one_error_line(err).startswith(message), err
    assert not out.exists()


def test_synth_text_file_bounds(cli, tts, tmp_path, monkeypatch):
    big = tmp_path / "big.txt"
    big.write_text("a" * 1_000_001, encoding="utf-8")
    code, _, err = cli("synth", "--text-file", big, "-o", tmp_path / "x.wav")
    assert code == 2 and f"error: {big} is longer than 1000000 characters" in err
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"RIFF\xc0\xff\x00")
    code, _, err = cli("synth", "--text-file", binary, "-o", tmp_path / "x.wav")
    assert code == 2 and f"error: cannot read text file {binary}: 'utf-8' codec can't decode" in err
    code, _, err = cli("synth", "--text-file", tmp_path, "-o", tmp_path / "x.wav")
    assert code == 2 and f"error: cannot read text file {tmp_path}" in err and "Is a directory" in err
    # 1 MB exactly is accepted and handed over whole (synthesis itself stubbed: hours of audio)
    exact = tmp_path / "exact.txt"
    exact.write_text("word " * 200_000, encoding="utf-8")
    seen = {}
    monkeypatch.setattr(type(tts), "synthesize_iter", lambda self, text, **kw: seen.setdefault(
        "n", len(text)) and iter([np.zeros(240, np.float32)]))
    code, _, err = cli("synth", "--text-file", exact, "-o", tmp_path / "exact.wav")
    assert code == 0 and seen["n"] == 1_000_000, err


@pytest.mark.parametrize("flag, value, message", [
    ("--seed", "-1", "argument --seed: expected an integer from 0 to 2**63-1, got -1"),
    ("--seed", str(2**64), "argument --seed: expected an integer from 0 to 2**63-1, got 18446744073709551616"),
    ("--seed", "one", "argument --seed: expected an integer from 0 to 2**63-1, got 'one'"),
    ("--speed", "nan", "error: speed must be a finite number (0.5-2.0), got nan"),
    ("--speed", "0", "error: speed must be between 0.5 and 2.0, got 0.0"),
    ("--device", "bogus", "argument --device: device 'bogus' is not a torch device"),
    ("--text-ids", "1,x", "argument --text-ids: expected comma-separated integers, got '1,x'"),
    ("--text-ids", "-1,5", "error: text_ids must be ids in [0, 256), got range [-1, 5]"),
    ("--speaker", "x" * 10_000, "error: speaker is 10000 characters: no saved speaker id or voice name is longer "
                                "than 128"),
    ("--speaker", "../../etc/passwd", "error: unknown speaker '../../etc/passwd' (known: "),
    ("--speaker", "a\x00b", "error: speaker contains a NUL character at character 1"),
    ("--instruct", "", "error: instruct text is empty"),
    ("--voices-dir", "MISSING", "error: --voices-dir 'MISSING' is not a folder"),
])
def test_synth_hostile_options(cli, tmp_path, flag, value, message):
    out = tmp_path / "x.wav"
    missing = tmp_path / "missing-voices"
    value, message = value.replace("MISSING", str(missing)), message.replace("MISSING", str(missing))
    args = ["synth", "--text", "Hello.", f"{flag}={value}", "-o", out]
    if flag == "--text-ids":
        args = ["synth", f"--text-ids={value}", "-o", out]
    code, _, err = cli(*args)
    assert code == 2 and message in one_error_line(err), err
    assert len(err) < 3000 and not out.exists()
    assert not missing.exists()  # a mistyped voice store is not created


def test_unusable_voice_store(cli, tmp_path):
    store = tmp_path / "voices"
    (store / "voices.sqlite3").mkdir(parents=True)  # sqlite cannot open a folder as its database
    code, _, err = cli("synth", "--text", "Hello.", "--voices-dir", store, "-o", tmp_path / "x.wav")
    assert code == 2 and f"cannot open the voice store {store / 'voices.sqlite3'}: " in one_error_line(err), err
    assert not (tmp_path / "x.wav").exists()


def test_synth_hostile_output_paths(cli, tmp_path):
    cases = {
        str(tmp_path / "missing" / "x.wav"): f"the folder '{tmp_path / 'missing'}' does not exist",
        str(tmp_path): "is a folder: name the audio file to write",
        str(tmp_path / "x.m4a"): "cannot write .m4a files; name the output .wav, .flac, .ogg, .opus, .mp3",
        "": "the output path is empty",
        str(tmp_path / ("x" * 5000 + ".wav")): "cannot use",
    }
    for output, message in cases.items():
        code, _, err = cli("synth", "--text", "Hello.", "-o", output)
        assert code == 2 and "argument -o/--output: " in err and message in err, (output[:80], err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_model_path_hostile(tmp_path, audio):
    for model, message in ((audio["good"], "error: model directory not found"),
                           (tmp_path, f"error: {tmp_path} is not a CosyVoice 2 model directory"),
                           ("m" * 5000, "error: cannot open model directory 'mmm")):
        with pytest.raises(CadenzaError) as info:
            cadenza.api.model_family(model)
        assert message.removeprefix("error: ") in str(info.value) and len(str(info.value)) < 400
    with pytest.raises(InputError, match="the model path must be a string or a path, not int"):
        cadenza.api.load(5)


@pytest.mark.parametrize("name, message", [
    ("not_audio", "cannot decode '{path}': not a supported audio format"),
    ("truncated", "{what} audio is too short: 8 samples (0.0003 s), need at least 0.5 s"),
    ("empty", "audio file '{path}' is empty (0 bytes)"),
    ("zero", "'{path}' contains no audio samples"),
    ("one", "{what} audio is too short: 1 sample (0.0000 s), need at least 0.5 s"),
    ("ten_min", "{what} audio is too long: 600.00 s, the limit is {limit} s"),
    ("missing", "audio file not found: '{path}'"),
])
def test_hostile_prompt_audio(cli, audio, tmp_path, name, message):
    """The same refusals for a prompt and a voice conversion's source, each named as what it is (a source may run to
    300 s, read in windows)."""
    path = audio.get(name, tmp_path / "missing.wav")
    out = tmp_path / "x.wav"
    for argv, what, limit in ((("synth", "--text", "Hello.", "--prompt-wav", path, "-o", out), "prompt", 30),
                              (("vc", "--source-wav", path, "--prompt-wav", audio["good"], "-o", out), "source", 300)):
        code, _, err = cli(*argv)
        expected = message.format(path=path, what=what, limit=limit)
        assert code == 2 and expected in one_error_line(err), (argv[0], err)
        assert not out.exists()


def test_accepted_audio_formats_become_mono_at_the_model_rate(tts, cli, audio, tmp_path):
    """8-bit, 96 kHz and stereo prompts are decoded, averaged to mono and resampled (not refused)."""
    reference = tts.voice_from_audio(audio["good"], TEXT)
    for name in ("u8", "hz96", "stereo"):
        voice = tts.voice_from_audio(audio[name], TEXT)
        assert voice.embedding.shape == reference.embedding.shape, name
        assert voice.flow_prompt_speech.numel() > 0, name
    out = tmp_path / "stereo96k.wav"
    code, _, err = cli("synth", "--text", "Hello.", "--prompt-wav", audio["hz96"], "--seed", "1", "-o", out)
    assert code == 0, err
    info = sf.info(out)
    assert info.samplerate == SR and info.channels == 1 and info.frames > 0


def test_speakers_command_hostile_ids(cli, audio):
    code, _, err = cli("speakers", "--add", "", "--prompt-wav", audio["good"], "--prompt-text", TEXT)
    assert code == 2 and "error: --add needs a speaker id" in err
    code, _, err = cli("speakers", "--prompt-wav", audio["good"])
    assert code == 2 and "error: --prompt-wav/--prompt-text are only used with --add ID" in err
    code, _, err = cli("speakers", "--add", "../../x", "--prompt-wav", audio["good"], "--prompt-text", TEXT)
    assert code == 2 and "error: invalid speaker id '../../x': use 1-64 letters" in err
    code, _, err = cli("speakers", "--add", "x" * 10_000, "--prompt-wav", audio["good"], "--prompt-text", TEXT)
    assert code == 2 and "error: speaker id is 10000 characters; at most 64" in err
    code, _, err = cli("speakers", "--add", "ok", "--prompt-wav", audio["good"], "--prompt-text", TEXT)
    assert code == 2 and "the built-in model folder is part of the installed package" in err


def test_clone_and_design_hostile(cli, audio, tmp_path):
    out = tmp_path / "x.wav"
    code, _, err = cli("clone", "--text", "Hi", "--reference-wav", audio["not_audio"], "-o", out)
    assert code == 2 and "error: cannot decode" in err and str(audio["not_audio"]) in err
    code, _, err = cli("clone", "--text", "Hi", "--prompt-wav", audio["good"], "--prompt-text", " ", "-o", out)
    assert code == 2 and "error: --prompt-wav needs its transcript --prompt-text" in err
    code, _, err = cli("design", "--text", "(warm)\ud800", "-o", out)
    assert code == 2 and "error: --text is not valid Unicode: a lone surrogate U+D800 at character 6" in err
    assert not out.exists()


def test_unexpected_failures_are_one_line_without_traceback(cli, monkeypatch, tmp_path):
    import cadenza.cli.main as main_mod

    def boom(args):
        raise RuntimeError("something broke\nsecond line")

    monkeypatch.setattr(main_mod, "_synth", boom)
    code, _, err = cli("synth", "--text", "Hi.", "-o", tmp_path / "x.wav")
    assert code == 1 and err.strip() == ("error: unexpected RuntimeError: something broke second line (a bug: "
                                         "please report it; -v prints the traceback)")


@pytest.mark.parametrize("name", ["out.wav", "out.mp3"])
def test_audio_output_is_atomic(tts, tmp_path, monkeypatch, name):
    """A failure while the file is written leaves neither a half file nor a temporary file; an existing file is
    kept."""
    target = tmp_path / name
    target.write_bytes(b"previous")

    write = sf.SoundFile.write

    def half_then_fail(self, data):
        write(self, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sf.SoundFile, "write", half_then_fail)
    with pytest.raises(InputError, match=re.escape(f"cannot write {target}: No space left on device")):
        cadenza.api.Audio(np.zeros(100, np.float32), SR).save(target)
    assert target.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == [name]
    monkeypatch.undo()
    cadenza.api.Audio(np.zeros(2400, np.float32), SR).save(target)
    assert sf.info(target).frames == 2400 and [p.name for p in tmp_path.iterdir()] == [name]


def test_subprocess_errors_have_no_traceback(tmp_path):
    """Real processes: argv bytes that are not UTF-8, and an alias-bomb training config."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run([sys.executable, "-m", "cadenza", "synth", b"--text", b"hi \xff there", "-o",
                           str(tmp_path / "x.wav")], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith("error: --text is not valid Unicode: a lone surrogate U+DCFF at character 3 "
                                        "(is the command line in UTF-8?)"), proc.stderr
    bomb = tmp_path / "bomb.yaml"
    rows = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]']
    rows += [f"{c}: &{c} [{','.join(['*' + p] * 10)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    bomb.write_text("\n".join(rows) + "\n")
    proc = subprocess.run([sys.executable, "-m", "cadenza", "train", "lm", "--config", str(bomb), "--data",
                           str(tmp_path), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (f"error: training config {bomb}: it expands to more than 100,000 nodes (YAML aliases): an alias "
            "bomb?") in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_serve_argument_validation(cli):
    for flag, value, message in (("--port", "70000", "expected a port number from 1 to 65535, got 70000"),
                                 ("--max-upload-mb", "inf", "expected a positive finite number, got 'inf'"),
                                 ("--max-upload-mb", "-1", "expected a positive finite number, got '-1'"),
                                 ("--max-audio-seconds", "nan", "expected a positive finite number, got 'nan'"),
                                 ("--device", "cuda:7" if not torch.cuda.is_available() else "cuda:99",
                                  "device 'cuda:")):
        code, _, err = cli("serve", flag, value)
        assert code == 2 and f"argument {flag}: {message}" in err, err
    code, _, err = cli("serve", "--max-conversion-seconds", "400")  # past what the flow renders: refused up front
    assert code == 2 and "bad server setting: max_conversion_seconds must be in (0, 300]" in err, err


