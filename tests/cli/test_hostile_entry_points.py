"""The hostile-input sweep of the entry points (issue #19): the ``cadenza`` command line, the Python API
(``Cadenza``/``VoxCPM2`` methods other than ``from_pretrained``), the training launcher, training configs and
checkpoints, and data preparation. Every row of docs/hostile_input.md is one case here.

Each hostile input must give a specific ``cadenza.errors`` exception (the CLI: exit code 2 and one ``error: ...``
line naming the argument or file, never a traceback), and nothing half-written. The CLI runs in-process against
one loaded built-in model (``cadenza.api.load`` is pointed at it); two cases run as real subprocesses.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml

import cadenza.api
import cadenza.api.audio
from cadenza.cli.main import main as cli_main
from cadenza.errors import AudioError, CadenzaError, CheckpointError, InputError, TextError, UnknownSpeakerError

REPO = Path(__file__).resolve().parents[2]
SR = 24000
TEXT = "the quick brown fox number one"  # ~24 letters in 1.4 s: a speaking rate the data checks accept


def _speech(seconds: float, sr: int = SR, f0: float = 140.0, seed: int = 0) -> np.ndarray:
    """A voiced, amplitude-modulated harmonic signal (speech-like enough for every check)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.05 * np.sin(2 * np.pi * 3 * t))) / sr
    wav = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t) ** 2)
    return (0.3 * wav + 0.003 * rng.standard_normal(t.size)).astype(np.float32)


# --------------------------------------------------------------------------------------------------------------
# shared fixtures: one built-in model, a folder of hostile audio files
# --------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tts():
    torch.set_num_threads(1)
    model = cadenza.api.load(None)  # the built-in cadenza-tiny
    yield model
    model.close()


@pytest.fixture(scope="module")
def audio(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("audio")
    good = _speech(1.4)
    files = {name: d / f"{name}.wav" for name in ("good", "zero", "one", "ten_min", "u8", "hz96", "stereo")}
    sf.write(files["good"], good, SR)
    sf.write(files["zero"], np.zeros(0, np.float32), SR)
    sf.write(files["one"], np.array([0.5], np.float32), SR)
    sf.write(files["ten_min"], np.tile(_speech(1.0, 8000), 600), 8000, subtype="PCM_U8")  # 600 s, 4.8 MB
    sf.write(files["u8"], good, SR, subtype="PCM_U8")
    sf.write(files["hz96"], _speech(1.4, 96000), 96000)
    sf.write(files["stereo"], np.stack([good, good[::-1]], 1), SR)
    files["not_audio"] = d / "not_audio.wav"
    files["not_audio"].write_text("this is not audio")
    files["truncated"] = d / "truncated.wav"
    files["truncated"].write_bytes(files["good"].read_bytes()[:60])
    files["empty"] = d / "empty.wav"
    files["empty"].write_bytes(b"")
    return files


@pytest.fixture
def cli(tts, monkeypatch, capsys):
    """``cli(*argv) -> (exit code, stdout, stderr)``, in-process, with the shared built-in model."""
    def load(path=None, voices_dir=None, **kwargs):  # opens the voice store as Cadenza.from_pretrained does
        if voices_dir is not None:
            from cadenza.voices import VoiceStore

            VoiceStore(voices_dir).close()
        return tts

    monkeypatch.setattr(cadenza.api, "load", load)
    monkeypatch.delenv("CADENZA_VOICES_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", "/nonexistent-cadenza-test")  # no default voice store

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = cli_main([str(a) for a in argv])
        except SystemExit as exc:  # argparse refuses the argument itself
            code = exc.code
        out, err = capsys.readouterr()
        assert "Traceback" not in err, err
        return code, out, err

    return run


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:") or ": error: " in line]
    assert len(lines) == 1, err
    return lines[0]


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
    assert code == 2 and _one_error_line(err).startswith(message), err
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
    monkeypatch.setattr(type(tts), "synthesize", lambda self, text, **kw: seen.setdefault(
        "n", len(text)) and cadenza.api.Audio(np.zeros(240, np.float32), SR))
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
    assert code == 2 and message in _one_error_line(err), err
    assert len(err) < 3000 and not out.exists()
    assert not missing.exists()  # a mistyped voice store is not created


def test_unusable_voice_store(cli, tmp_path):
    store = tmp_path / "voices"
    (store / "voices.sqlite3").mkdir(parents=True)  # sqlite cannot open a folder as its database
    code, _, err = cli("synth", "--text", "Hello.", "--voices-dir", store, "-o", tmp_path / "x.wav")
    assert code == 2 and f"cannot open the voice store {store / 'voices.sqlite3'}: " in _one_error_line(err), err
    assert not (tmp_path / "x.wav").exists()


def test_synth_hostile_output_paths(cli, tmp_path):
    cases = {
        str(tmp_path / "missing" / "x.wav"): f"the folder '{tmp_path / 'missing'}' does not exist",
        str(tmp_path): "is a folder: name the WAV file to write",
        str(tmp_path / "x.mp3"): "cadenza writes WAV files; use a .wav name",
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
    ("not_audio", "cannot decode '{}': not a supported audio format"),
    ("truncated", "prompt audio is too short: 8 samples (0.0003 s), need at least 0.5 s"),
    ("empty", "audio file '{}' is empty (0 bytes)"),
    ("zero", "'{}' contains no audio samples"),
    ("one", "prompt audio is too short: 1 sample (0.0000 s), need at least 0.5 s"),
    ("ten_min", "prompt audio is too long: 600.00 s, the limit is 30 s"),
    ("missing", "audio file not found: '{}'"),
])
def test_hostile_prompt_audio(cli, audio, tmp_path, name, message):
    path = audio.get(name, tmp_path / "missing.wav")
    out = tmp_path / "x.wav"
    for argv in (("synth", "--text", "Hello.", "--prompt-wav", path, "-o", out),
                 ("vc", "--source-wav", path, "--prompt-wav", audio["good"], "-o", out)):
        code, _, err = cli(*argv)
        assert code == 2 and message.format(path) in _one_error_line(err), (argv[0], err)
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


def test_wav_output_is_atomic(tts, tmp_path, monkeypatch):
    """A failure while the WAV is written leaves neither a half file nor a temporary file; an existing file is kept."""
    target = tmp_path / "out.wav"
    target.write_bytes(b"previous")

    def half_then_fail(path, samples, sample_rate):
        Path(path).write_bytes(b"RIFF\x00\x00")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cadenza.api.audio, "save_wav", half_then_fail)
    with pytest.raises(InputError, match=re.escape(f"cannot write {target}: No space left on device")):
        cadenza.api.Audio(np.zeros(100, np.float32), SR).save(target)
    assert target.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["out.wav"]
    monkeypatch.undo()
    cadenza.api.Audio(np.zeros(100, np.float32), SR).save(target)
    assert sf.info(target).frames == 100 and [p.name for p in tmp_path.iterdir()] == ["out.wav"]


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


# --------------------------------------------------------------------------------------------------------------
# Python API: Cadenza
# --------------------------------------------------------------------------------------------------------------
def _good() -> tuple[np.ndarray, int]:
    return _speech(1.4), SR


@pytest.mark.parametrize("kwargs, error, message", [
    ({"text": 5}, TextError, "text must be a string, not int"),
    ({"text": b"hello"}, TextError, "text must be a string, not bytes"),
    ({"text": "a\x00b"}, TextError, "text contains a NUL character at character 1"),
    ({"text": "hi \ud800"}, TextError, "text is not valid Unicode: a lone surrogate U+D800 at character 3"),
    ({"text": "hi \ud800", "normalize": False}, TextError, "text is not valid Unicode"),
    ({"text": " " * 1_000_000}, TextError, "text is empty"),
    ({"text": "word " * 200_000 + "\x00"}, TextError, "text contains a NUL character at character 1000000"),
    ({"text": "Hi.", "prompt_wav": "GOOD", "prompt_text": 5}, TextError, "prompt_text must be a string, not int"),
    ({"text": "Hi.", "prompt_wav": "GOOD", "prompt_text": "a\udc80"}, TextError, "prompt_text is not valid Unicode"),
    ({"text": "Hi.", "instruct": "\ud800"}, TextError, "instruct is not valid Unicode"),
    ({"text_ids": ["a", "b"]}, InputError, "text_ids must be integer token ids; item 0 is 'a' (str)"),
    ({"text_ids": [1.5]}, InputError, "text_ids must be integer token ids; item 0 is 1.5 (float)"),
    ({"text_ids": [True]}, InputError, "item 0 is True (bool)"),
    ({"text_ids": "123"}, InputError, "text_ids must be a sequence of integer token ids, not str"),
    ({"text_ids": np.ones((2, 3), np.int64)}, InputError, "got int64 of shape (2, 3)"),
    ({"text_ids": [-1, 5]}, TextError, "text_ids must be ids in [0, "),
    ({"text": "Hi.", "seed": -1}, InputError, "seed must be an integer from 0 to 2**63-1, got -1"),
    ({"text": "Hi.", "seed": 2**64}, InputError, "got 18446744073709551616"),
    ({"text": "Hi.", "seed": "1"}, InputError, "got '1'"),
    ({"text": "Hi.", "seed": 1.5}, InputError, "got 1.5"),
    ({"text": "Hi.", "speed": "fast"}, InputError, "speed must be a finite number (0.5-2.0), got 'fast'"),
    ({"text": "Hi.", "speed": float("nan")}, InputError, "got nan"),
    ({"text": "Hi.", "speed": None}, InputError, "got None"),
    ({"text": "Hi.", "speaker": 5}, InputError, "speaker must be a string (a saved speaker id or voice name), not int"),
    ({"text": "Hi.", "speaker": "x" * 10_000}, UnknownSpeakerError, "speaker is 10000 characters"),
    ({"text": "Hi.", "speaker": ""}, UnknownSpeakerError, "speaker is empty"),
    ({"text": "Hi.", "speaker": "../../etc/passwd"}, UnknownSpeakerError, "unknown speaker '../../etc/passwd'"),
    ({"text": "Hi.", "prompt_wav": 5}, AudioError, "cannot read audio from a int"),
    ({"text": "Hi.", "prompt_wav": "x" * 10_000}, AudioError, "cannot read audio file 'xxx"),
    ({"text": "Hi.", "prompt_wav": b""}, AudioError, "is empty (0 bytes)"),
    ({"text": "Hi.", "prompt_wav": (np.ones(SR, np.float32), 0)}, AudioError,
     "sample rate must be an integer from 8000 to 192000 Hz, got 0"),
    ({"text": "Hi.", "prompt_wav": (np.ones(SR, np.float32), "24000")}, AudioError, "got '24000'"),
    ({"text": "Hi.", "prompt_wav": (np.ones(SR, np.float32), True)}, AudioError, "got True"),
    ({"text": "Hi.", "prompt_wav": (np.ones(SR, np.float32), 10**9)}, AudioError, "got 1000000000"),
    ({"text": "Hi.", "prompt_wav": (np.ones((1, 1, SR), np.float32), SR)}, AudioError,
     "prompt audio must be [samples] or [channels, samples], got shape (1, 1, 24000)"),
    ({"text": "Hi.", "prompt_wav": (np.array(["a", "b"]), SR)}, AudioError,
     "prompt audio samples must be numbers (float in [-1, 1] or integer PCM), got dtype <U1"),
    ({"text": "Hi.", "prompt_wav": ([[1.0, 2.0], [3.0]], SR)}, AudioError, "are not an array of numbers"),
    ({"text": "Hi.", "prompt_wav": (np.ones(SR, np.float32), SR, 1)}, AudioError,
     "prompt audio as a tuple is (samples, sample_rate), got 3 items"),
    ({"text": "Hi.", "prompt_wav": (np.full(SR, np.nan, np.float32), SR)}, AudioError, "NaN or infinite samples"),
    ({"text": "Hi.", "prompt_wav": (np.zeros(0, np.float32), SR)}, AudioError, "too short: 0 samples"),
    ({"text": "Hi.", "prompt_wav": (np.ones(1, np.float32), SR)}, AudioError, "too short: 1 sample"),
    ({"text": "Hi.", "prompt_wav": (np.tile(_speech(1.0, 8000), 600), 8000)}, AudioError, "too long: 600.00 s"),
])
def test_api_synthesize_hostile(tts, kwargs, error, message):
    kwargs = {k: (_good() if isinstance(v, str) and v == "GOOD" else v) for k, v in kwargs.items()}
    with pytest.raises(error) as info:
        tts.synthesize(**kwargs)
    assert message in str(info.value) and len(str(info.value)) < 400, str(info.value)[:400]


def test_api_integer_pcm_prompts_are_scaled(tts):
    """(samples, rate) with int16 / uint8 PCM: scaled to [-1, 1] like a decoded file, not taken as huge floats."""
    wav = _speech(1.4)
    as_float = tts.voice_from_audio((wav, SR), TEXT)
    as_int16 = tts.voice_from_audio((np.round(wav * 32767).astype(np.int16), SR), TEXT)
    as_uint8 = tts.voice_from_audio((np.round(wav * 127 + 128).astype(np.uint8), SR), TEXT)
    torch.testing.assert_close(as_int16.embedding, as_float.embedding, atol=1e-3, rtol=1e-3)
    assert torch.nn.functional.cosine_similarity(as_uint8.embedding.flatten(),
                                                 as_float.embedding.flatten(), dim=0) > 0.99


def test_api_convert_voice_and_add_speaker_hostile(tts, audio):
    with pytest.raises(InputError, match=r"seed must be an integer from 0 to 2\*\*63-1, got -1"):
        tts.convert_voice(audio["good"], audio["good"], seed=-1)
    with pytest.raises(AudioError, match="sample rate must be an integer"):
        tts.convert_voice((np.ones(SR, np.float32), 0), audio["good"])
    with pytest.raises(AudioError, match="too long: 600.00 s"):
        tts.convert_voice(audio["ten_min"], audio["good"])
    with pytest.raises(AudioError, match="cannot read audio from a NoneType"):
        tts.convert_voice(None, audio["good"])
    # the id is checked before the audio is decoded: not_audio would fail otherwise
    for speaker_id, error, message in (("x" * 10_000, InputError, "speaker id is 10000 characters; at most 64"),
                                       ("../../x", InputError, "invalid speaker id '../../x'"),
                                       ("", InputError, "invalid speaker id ''"),
                                       ("a\x00", InputError, "invalid speaker id 'a\\x00'"),
                                       (5, InputError, "speaker id must be a string, not int")):
        with pytest.raises(error) as info:
            tts.add_speaker(speaker_id, audio["not_audio"], TEXT, save=False)
        assert message in str(info.value) and len(str(info.value)) < 200
    with pytest.raises(TextError, match="prompt_text is not valid Unicode"):
        tts.add_speaker("ok", audio["good"], "\ud800", save=False)
    with pytest.raises(AudioError, match="cannot decode"):
        tts.add_speaker("ok", audio["not_audio"], TEXT, save=False)
    assert "ok" not in tts.speakers


def test_api_synthesize_stream_hostile(tts):
    with pytest.raises(TextError, match="text must be a string or an iterable of strings, not int"):
        tts.synthesize_stream(5)
    with pytest.raises(TextError, match="text must be a string or an iterable of strings, not bytes"):
        tts.synthesize_stream(b"hello")
    with pytest.raises(TextError, match="text is not valid Unicode"):
        tts.synthesize_stream("\ud800 hi")
    for pieces, message in ((["hi \ud800"], "text piece 0 is not valid Unicode"),
                            (["hello ", "a\x00"], "text piece 1 contains a NUL character at character 1"),
                            ([b"hi"], "text pieces must be strings, not bytes (piece 0)"),
                            ([], "the text stream ended with nothing to speak"),
                            (["  ", "\n", "..."], "the text stream ended with nothing to speak")):
        with pytest.raises(TextError, match=re.escape(message)):
            list(tts.synthesize_stream(iter(pieces), seed=0))


def test_voxcpm2_entry_points_check_their_arguments():
    """``VoxCPM2`` refuses hostile arguments before its engine sees them (a stand-in engine records any call)."""
    from cadenza.api.voxcpm2 import VoxCPM2

    class Engine:
        calls = 0
        sample_rate = 48000  # the output watermark is set up for it

        def build(self, *a, **k):
            Engine.calls += 1
            raise AssertionError("the engine must not be reached")

        synthesize = stream = build

    vx = VoxCPM2(Engine(), Path("."))
    for call, error, message in (
        (lambda: vx.synthesize(5), TextError, "text must be a string, not int"),
        (lambda: vx.synthesize("hi\x00"), TextError, "text contains a NUL character at character 2"),
        (lambda: vx.synthesize("hi \ud800"), TextError, "text is not valid Unicode"),
        (lambda: vx.synthesize("hi", prompt_wav="x.wav", prompt_text="\udcff"), TextError,
         "prompt_text is not valid Unicode"),
        (lambda: vx.synthesize("hi", seed=-3), InputError, "seed must be an integer from 0 to 2**63-1, got -3"),
        (lambda: vx.synthesize("hi", seed=1.5), InputError, "got 1.5"),
        (lambda: vx.synthesize_stream(iter(["hi"])), TextError, "give the whole text as a string"),
        (lambda: vx.design(5, "hi"), TextError, "description must be a string, not int"),
        (lambda: vx.design("warm", "\x00"), TextError, "text contains a NUL character"),
        (lambda: vx.design("()", "hi"), InputError, "the voice description is empty"),
    ):
        with pytest.raises(error) as info:
            call()
        assert message in str(info.value)
    assert Engine.calls == 0


def test_api_device_checks():
    from cadenza.api import check_device

    assert check_device("cpu") == "cpu"
    for device, message in (("bogus", "is not a torch device"), ("vulkan", "device type 'vulkan' is not supported"),
                            (None, "is not a torch device")):
        with pytest.raises(InputError, match=message):
            check_device(device)
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="CUDA is not available on this machine"):
            check_device("cuda:0")


# --------------------------------------------------------------------------------------------------------------
# training: configs, stage names, checkpoints, resume
# --------------------------------------------------------------------------------------------------------------
def _lm_config() -> dict:
    config = yaml.safe_load((REPO / "configs" / "train" / "lm_tiny.yaml").read_text())
    config["train"].update(max_steps=2, ckpt_every=1, log_every=1)
    return config


def _write_config(tmp_path: Path, config: dict | str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    return path


def _set(config: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return config


@pytest.mark.parametrize("key, value, message", [
    ("train", [1, 2], "training config [train]: expected a mapping, got list"),
    ("train.batch_size", "4", "training config [train]: batch_size must be an integer, got '4' (str)"),
    ("train.batch_size", 4.5, "batch_size must be an integer, got 4.5 (float)"),
    ("train.batch_size", True, "batch_size must be an integer, got True (bool)"),
    ("train.batch_size", -1, "training config [train]: batch_size must be >= 1, got -1"),
    ("train.max_steps", 0, "max_steps must be >= 1, got 0"),
    ("train.seed", -1, "seed must be >= 0, got -1"),
    ("train.seed", 2**70, "seed must be at most 2**32-1"),
    ("train.progress", "no", "progress must be true or false, got 'no' (str)"),
    ("train.bach_size", 4, "unknown keys ['bach_size']"),
    ("train.optim", [1], "training config [train.optim]: expected a mapping, got list"),
    ("train.optim.lr", "fast", "lr must be a number, got 'fast' (str)"),
    ("train.optim.lr", "3e-3", "(YAML reads numbers such as 1e-4 as text: write 1.0e-4)"),
    ("train.optim.lr", float("inf"), "lr must be a finite number, got inf"),
    ("train.optim.lr", float("nan"), "lr must be a finite number, got nan"),
    ("train.optim.lr", -1.0, "lr must be > 0, got -1.0"),
    ("train.optim.betas", 0.9, "betas must be a list of 2 numbers, got 0.9 (float)"),
    ("train.optim.betas", [0.9, "x"], "betas must be a list of 2 numbers"),
    ("train.optim.grad_clip", "x", "grad_clip must be a number, got 'x' (str)"),
    ("lm", "x", "training config [lm]: expected a mapping, got str"),
    ("lm.mix_probability", "x", "training config [lm]: mix_probability must be a number, got 'x' (str)"),
    ("lm.foo", 1, "training config [lm]: unknown keys ['foo']"),
    ("model", "x", "training config [model]: expected a mapping, got str"),
    ("model.qwen.hidden_size", -4, "Qwen2Config.hidden_size must be a positive integer, got -4"),
    ("lm_", {"mix_probability": 0.1}, "training config: unknown section 'lm_'"),
])
def test_training_config_wrong_values(cli, tmp_path, key, value, message):
    config = _write_config(tmp_path, _set(_lm_config(), key, value))
    code, _, err = cli("train", "lm", "--config", config, "--data", tmp_path, "--out", tmp_path / "out")
    assert code == 2 and message in _one_error_line(err), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content, message", [
    ("train: [1, 2", "is not valid YAML: expected ',' or ']', but got '<stream end>' at line 1, column 13"),
    ("- 1\n- 2\n", "must be a mapping at the top level, not list"),
    ("train: !!python/object/apply:os.system ['touch PWNED']\n", "could not determine a constructor for the tag"),
    ("[" * 100_000, "is nested too deeply to be a config"),
    ("_x: &a [*a]\n", "an alias refers to a node that contains it (a recursive structure)"),
    ("# " + "x" * (1 << 20), "bytes; a config is at most 1048576"),
    (b"train: \xff\n", "is not UTF-8 text (byte 7: invalid start byte)"),
])
def test_training_config_hostile_files(tmp_path, monkeypatch, content, message):
    from cadenza.training.config import load_config_file

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError) as info:
        load_config_file(path)
    assert str(path) in str(info.value) and message in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "PWNED").exists()
    deep_json = tmp_path / "c.json"
    deep_json.write_text("[" * 100_000)
    with pytest.raises(InputError, match="is nested too deeply to be a config"):
        load_config_file(deep_json)


def test_training_argument_and_data_errors_create_nothing(cli, tmp_path):
    config = _write_config(tmp_path, _lm_config())
    code, _, err = cli("train", "lm", "--config", config, "--data", tmp_path, "--out", tmp_path / "out",
                       "--max-steps", "0")
    assert code == 2 and "argument --max-steps: expected a positive integer, got 0" in err
    code, _, err = cli("train", "lm", "--config", config, "--data", tmp_path / "nodata", "--out", tmp_path / "out")
    assert code == 2 and f"error: {tmp_path / 'nodata'} is not a prepared corpus (no index.jsonl)" in err
    assert not (tmp_path / "out").exists()


def test_training_stage_names(tmp_path):
    from cadenza.training.launcher import train
    from cadenza.training.registry import get_stage

    for name in ("", "../../etc", "x" * 10_000, "Lm", 5):
        with pytest.raises(InputError, match="is not a stage name; known: lm, dpo, flow, tokenizer"):
            get_stage(name)
    with pytest.raises(InputError, match="training stage 'no_such' is not available"):
        train("no_such", _write_config(tmp_path, _lm_config()), tmp_path, tmp_path / "out")


def _lm_data(root: Path) -> Path:
    from cadenza.data.shards import write_prepared

    rng = random.Random(0)
    records = []
    for i in range(8):
        text = [rng.randrange(1, 100) for _ in range(6)]
        speech = [(t * k) % 50 for t in text for k in (1, 3, 7, 11)]
        records.append(({"id": f"u{i}", "text": "x"}, {"text_ids": torch.tensor(text, dtype=torch.int32),
                                                       "speech_tokens": torch.tensor(speech, dtype=torch.int32)}))
    write_prepared(root, records, shard_size=4)
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A two-step lm run with a checkpoint per step (seconds on one core)."""
    from cadenza.training.launcher import train

    root = tmp_path_factory.mktemp("train")
    data = _lm_data(root / "data")
    config = _write_config(root, _lm_config())
    torch.set_num_threads(1)
    train("lm", config, data, root / "run")
    return {"data": data, "config": config, "run": root / "run"}


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_checkpoints_are_named_and_never_run(trained, tmp_path):
    from cadenza.training.checkpoint import load_checkpoint

    good = (trained["run"] / "checkpoints" / "step_2.pt").read_bytes()
    marker = tmp_path / "PWNED"
    evil = _Evil()
    evil.marker = marker
    cases = {
        "truncated": (good[: len(good) // 2], "is truncated or corrupt (not a complete torch archive)"),
        "empty": (b"", "is empty (an interrupted copy?)"),
        "garbage": (b"\x00" * 1000, "is truncated or corrupt"),
        "raw_pickle": (pickle.dumps(evil), "holds more than tensors and plain data"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / f"{name}.pt"
        path.write_bytes(data)
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(path)
        assert str(path) in str(info.value) and message in str(info.value), (name, str(info.value))
        assert "weights_only=False" not in str(info.value) and len(str(info.value)) < 400
    for name, obj, message in (("evil_torch", {"format": 1, "x": evil}, "refers to the Python object posix.system"),
                               ("a_list", [1, 2, 3], "is not a cadenza training checkpoint (format 1)"),
                               ("step_str", {"format": 1, "state": {}, "step": "abc"}, "'step' must be an integer"),
                               ("step_neg", {"format": 1, "state": {}, "step": -5}, "got '-5'")):
        path = tmp_path / f"{name}.pt"
        torch.save(obj, path)
        with pytest.raises(CheckpointError, match=re.escape(message)):
            load_checkpoint(path)
    assert not marker.exists()  # the pickles' code never ran


def test_resume_from_hostile_checkpoints(cli, trained, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    latest = run / "checkpoints" / "step_2.pt"
    good = latest.read_bytes()
    ckpt = torch.load(latest, weights_only=True)
    argv = ("train", "lm", "--config", trained["config"], "--data", trained["data"], "--out", run, "--resume",
            "--max-steps", "3")
    marker = tmp_path / "PWNED"
    evil = _Evil()
    evil.marker = marker
    wrong_shape = {**ckpt, "state": {**ckpt["state"], "model": {k: torch.zeros(3) for k in ckpt["state"]["model"]}}}
    for payload, message in (
        (good[:100], f"error: training checkpoint {latest} is truncated or corrupt"),
        ({**ckpt, "x": evil}, f"error: refused to load training checkpoint {latest}"),
        (wrong_shape, f"error: {latest} does not fit this lm model (written with another config, or damaged): "
                      "RuntimeError: Error(s) in loading state_dict"),
        ({**ckpt, "state": "x"}, "its 'state' is a str, not a mapping (delete it to resume from the one before)"),
        ({**ckpt, "rng": [{"torch": "x"}]}, "unreadable RNG state of rank 0"),
        ({**ckpt, "stage": "flow"}, "is a checkpoint of stage 'flow', not 'lm'"),
    ):
        if isinstance(payload, bytes):
            latest.write_bytes(payload)
        else:
            torch.save(payload, latest)
        code, _, err = cli(*argv)
        assert code == 2 and message in _one_error_line(err), err
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1.pt", "step_2.pt"]
    assert not marker.exists()
    code, _, err = cli("train", "lm", "--config", trained["config"], "--data", trained["data"], "--out",
                       trained["config"])
    assert code == 2 and f"error: --out {trained['config']} is a file, not a folder" in err


def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    from cadenza.training import checkpoint

    def half_then_interrupt(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.torch, "save", half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(tmp_path, 7, {"stage": "lm", "state": {}})
    assert list((tmp_path / "checkpoints").iterdir()) == []


# --------------------------------------------------------------------------------------------------------------
# data preparation
# --------------------------------------------------------------------------------------------------------------
def _prepare(cli, corpus: Path, out: Path, layout: str = "jsonl", *extra: str) -> tuple[int, str]:
    code, _, err = cli("data", "prepare", "--corpus", corpus, "--layout", layout, "--out", out, "--no-progress",
                       *extra)
    return code, err


def test_prepare_hostile_manifests(cli, tmp_path, audio):
    out = tmp_path / "out"
    cases = {
        "binary.jsonl": (b"\xff\xfe\x00garbage", "is not UTF-8 text (line 1, byte 0: invalid start byte)"),
        "table.csv": (b"audio,text\ngood.wav,hello\n", "has no usable item: all 2 entries were rejected (the first: "
                                                         "line 1 is not JSON"),
        "empty.jsonl": (b"", "is empty: no entries"),
        "deep.jsonl": (b"[" * 100_000 + b"\n", "(the first: line 1 is nested too deeply to be a manifest entry)"),
    }
    for name, (content, message) in cases.items():
        manifest = tmp_path / name
        manifest.write_bytes(content)
        code, err = _prepare(cli, manifest, out)
        assert code == 2 and message in _one_error_line(err) and str(manifest) in err, (name, err)
    lj = tmp_path / "lj"
    lj.mkdir()
    (lj / "metadata.csv").write_bytes(b"id|\xff\n")
    code, err = _prepare(cli, lj, out, "ljspeech")
    assert code == 2 and f"the LJSpeech metadata {lj / 'metadata.csv'} is not UTF-8 text" in err
    assert not out.exists()  # nothing written for a corpus that cannot be read


def test_prepare_hostile_entries_are_rejected_with_reasons(cli, tmp_path, audio):
    good = tmp_path / "good.wav"
    sf.write(good, _speech(1.4), SR)
    rows = [
        {"id": "empty_text", "audio": str(good), "text": ""},
        {"id": "blank_text", "audio": str(good), "text": "   "},
        {"id": "nul_text", "audio": str(good), "text": "a\u0000b " + TEXT},
        {"id": "surrogate_text", "audio": str(good), "text": "\ud800 " + TEXT},  # json.dumps writes \\ud800
        {"id": "surrogate_id\udcff", "audio": str(good), "text": TEXT},
        {"id": "missing", "audio": str(tmp_path / "missing.wav"), "text": TEXT},
        {"id": "not_audio", "audio": str(audio["not_audio"]), "text": TEXT},
        {"id": "truncated", "audio": str(audio["truncated"]), "text": TEXT},
        {"id": "zero", "audio": str(audio["zero"]), "text": TEXT},
        {"id": "one", "audio": str(audio["one"]), "text": TEXT},
        {"id": "empty_file", "audio": str(audio["empty"]), "text": TEXT},
        {"id": "ten_min", "audio": str(audio["ten_min"]), "text": TEXT},
        {"id": "long_path", "audio": "x" * 5000, "text": TEXT},
        {"id": "folder", "audio": str(tmp_path), "text": TEXT},
        {"id": "device", "audio": "/dev/zero", "text": TEXT},
        {"id": "audio_int", "audio": 5, "text": TEXT},
        {"id": "text_int", "audio": str(good), "text": 5},
        {"id": ["x"], "audio": str(good), "text": TEXT},
        {"id": "megabyte", "audio": str(good), "text": "x" * 1_000_000},
        {"id": "u8", "audio": str(audio["u8"]), "text": TEXT},
        {"id": "hz96", "audio": str(audio["hz96"]), "text": TEXT},
        {"id": "stereo", "audio": str(audio["stereo"]), "text": TEXT},
        {"id": "dup", "audio": str(good), "text": TEXT},
        {"id": "dup", "audio": str(good), "text": TEXT},
        "not json",
        "[1, 2]",
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    code, err = _prepare(cli, manifest, out, "jsonl", "--shard-size", "8")
    assert code == 0, err
    from cadenza.data.shards import read_jsonl

    accepted = sorted(e["id"] for e in read_jsonl(out / "index.jsonl"))
    assert accepted == ["dup", "hz96", "stereo", "u8"]
    rejected = {r["id"]: (r["category"], r["reason"]) for r in read_jsonl(out / "rejected.jsonl")}
    expected = {
        "empty_text": ("text", "transcript is empty"),
        "blank_text": ("text", "transcript is empty"),
        "nul_text": ("corpus", "line 3: text contains a NUL character at character 1"),
        "surrogate_text": ("corpus", "line 4: text is not valid Unicode (a lone surrogate U+D800 at character 0)"),
        "surrogate_id\\udcff": ("corpus", "line 5: id is not valid Unicode (a lone surrogate U+DCFF"),
        "missing": ("missing", "missing audio file"),
        "not_audio": ("unreadable", "unreadable audio: cannot decode"),
        "truncated": ("too_short", "too short: 0.00 s < 0.5 s"),
        "zero": ("unreadable", "contains no audio samples"),
        "one": ("too_short", "too short: 0.00 s < 0.5 s"),
        "empty_file": ("unreadable", "is empty (0 bytes)"),
        "ten_min": ("too_long", "too long: 600.00 s > 30 s"),
        "long_path": ("unreadable", "unreadable audio path: File name too long"),
        "folder": ("unreadable", "is not a regular file (a folder or a device)"),
        "device": ("unreadable", "is not a regular file (a folder or a device)"),
        "audio_int": ("corpus", "line 16: no 'audio' path"),
        "text_int": ("corpus", "line 17: no 'text' string"),
        "m-000018": ("corpus", "line 18: 'id' must be a string or an integer, not list"),
        "megabyte": ("mismatch", "transcript does not fit the audio: 1000000 letters in 1.40 s"),
        "m-000025": ("corpus", "line 25 is not JSON"),
        "m-000026": ("corpus", "line 26 is not a JSON object"),
        "dup": ("corpus", "duplicate id (the first occurrence is kept)"),
    }
    assert sorted(rejected) == sorted(expected)
    for uid, (category, reason) in expected.items():
        assert rejected[uid][0] == category and reason in rejected[uid][1], (uid, rejected[uid])
    summary = json.loads((out / "prepare.json").read_text())
    assert summary["accepted"] == 4 and summary["rejected"] == len(expected)
    from cadenza.data.dataset import ShardDataset

    for item in ShardDataset(out, ("wav", "mel")):  # 8-bit, 96 kHz and stereo stored as 24 kHz mono
        assert item["wav"].ndim == 1 and abs(item["wav"].numel() - int(1.4 * SR)) <= 2, item["id"]


def test_prepare_ljspeech_hostile_lines(cli, tmp_path):
    lj = tmp_path / "lj"
    (lj / "wavs").mkdir(parents=True)
    sf.write(lj / "wavs" / "ok.wav", _speech(1.4), SR)
    (lj / "metadata.csv").write_text(f"ok|{TEXT}|{TEXT}\n../../etc/passwd|{TEXT}\nnul\x00id|{TEXT}\n"
                                     f"huge|{'x' * 200_000}\nno_text\n", encoding="utf-8")
    out = tmp_path / "out"
    code, err = _prepare(cli, lj, out, "ljspeech")
    assert code == 0, err
    from cadenza.data.shards import read_jsonl

    assert [e["id"] for e in read_jsonl(out / "index.jsonl")] == ["ok"]
    rejected = {r["id"]: r["reason"] for r in read_jsonl(out / "rejected.jsonl")}
    assert "is not a plain file name" in rejected["../../etc/passwd"]
    assert "id contains a NUL character at character 3" in rejected["nul\x00id"]
    assert "missing audio file" in rejected["huge"]  # a 200 kB field is a line like any other (no csv field limit)
    assert "no transcript column" in rejected["no_text"]


@pytest.mark.parametrize("extra, message", [
    (("--shard-size", "0"), "argument --shard-size: expected a positive integer, got 0"),
    (("--part", "5", "--num-parts", "2"), "error: --part 5 is not below --num-parts 2"),
    (("--min-seconds", "nan"), "argument --min-seconds: expected a positive finite number, got 'nan'"),
    (("--max-seconds", "inf"), "argument --max-seconds: expected a positive finite number, got 'inf'"),
    (("--min-seconds", "40"), "error: --min-seconds 40 must be below --max-seconds 30"),
    (("--extractor", "nomodule"), "error: extractor spec 'nomodule' must look like 'package.module:factory[=ARG]'"),
    (("--extractor", "cadenza.data.extractors:manifest_arrays"),
     "error: extractor 'cadenza.data.extractors:manifest_arrays' failed to start: TypeError"),
    (("--extractor", "json:dumps=1"), "error: 'json:dumps=1' did not return an extractor"),
])
def test_prepare_hostile_options(cli, tmp_path, extra, message):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio": "a.wav", "text": TEXT}) + "\n")
    code, err = _prepare(cli, manifest, tmp_path / "out", "jsonl", *extra)
    assert code == 2 and message in _one_error_line(err), err
    assert not (tmp_path / "out").exists()


def test_prepare_hostile_output_folders(cli, tmp_path):
    good = tmp_path / "good.wav"
    sf.write(good, _speech(1.4), SR)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio": str(good), "text": TEXT}) + "\n")
    code, err = _prepare(cli, manifest, good)
    assert code == 2 and f"error: --out {good} is a file, not a folder" in err
    out = tmp_path / "out"
    out.mkdir()
    (out / "corpus.json").write_text("{not json")
    code, err = _prepare(cli, manifest, out)
    assert code == 2 and f"error: {out / 'corpus.json'} is unreadable" in err
    (out / "corpus.json").unlink()
    assert _prepare(cli, manifest, out)[0] == 0
    code, err = _prepare(cli, manifest, out, "jsonl", "--max-seconds", "20")  # other limits: not the same data
    assert code == 2 and "was prepared from a different corpus, shard size, feature set or limits" in err


class _InterruptOnce:
    """An extractor that interrupts the run (Ctrl-C) at its ``at``-th item, once."""

    name, fields = "marker", ("marker",)

    def __init__(self, at: int) -> None:
        self.at, self.seen, self.fired = at, 0, False

    def __call__(self, utt):
        self.seen += 1
        if self.seen == self.at and not self.fired:
            self.fired = True
            raise KeyboardInterrupt
        return {"marker": torch.ones(1)}


def test_interrupted_prepare_leaves_no_half_shard_and_resumes(tmp_path):
    from cadenza.data.prepare import prepare

    rows = []
    for i in range(4):
        sf.write(tmp_path / f"u{i}.wav", _speech(1.4, seed=i), SR)
        rows.append(json.dumps({"id": f"u{i}", "audio": f"u{i}.wav", "text": TEXT}))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    extractor = _InterruptOnce(at=4)  # the second item of shard 1
    with pytest.raises(KeyboardInterrupt):
        prepare(manifest, "jsonl", out, extractors=[extractor], shard_size=2, f0=False, progress=False)
    files = sorted(p.name for p in (out / "shards").iterdir())
    assert files == ["shard_00000.done.json", "shard_00000.safetensors"]  # no half shard 1, no temporary file
    assert not (out / "index.jsonl").exists() and not (out / "prepare.json").exists()
    summary = prepare(manifest, "jsonl", out, extractors=[extractor], shard_size=2, f0=False, progress=False)
    assert summary["complete"] and summary["processed_shards"] == 1 and summary["skipped_shards"] == 1
    assert summary["accepted"] == 4 and not [p for p in out.rglob("*.tmp")]


def test_damaged_prepared_folders_are_named(tmp_path):
    from cadenza.data.dataset import ShardDataset
    from cadenza.data.extractors import ManifestArraysExtractor
    from cadenza.data.prepare import add_features
    from cadenza.data.shards import tensor_file, write_prepared

    data = tmp_path / "data"
    write_prepared(data, [({"id": f"u{i}", "text": "x"}, {"wav": torch.zeros(2400, dtype=torch.int16),
                                                          "speech_tokens": torch.ones(5, dtype=torch.int32)})
                          for i in range(3)])
    shard = tensor_file(data, 0)
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(InputError, match=re.escape(f"shard file {shard} is unreadable (") + ".*truncated or damaged"):
        ShardDataset(data, ("speech_tokens",))
    arrays = tmp_path / "arrays.jsonl"
    arrays.write_text(json.dumps({"id": "u0", "text_ids": [1, 2]}) + "\n")
    with pytest.raises(InputError, match=re.escape(f"cannot read shard {shard}")):
        add_features(data, ManifestArraysExtractor(arrays), progress=False)
    index = data / "index.jsonl"
    index.write_text(index.read_text() + "{broken\n")
    with pytest.raises(InputError, match=re.escape(f"{index}:4 is not JSON")):
        ShardDataset(data, ("speech_tokens",))
    index.write_text('{"id": "u0"}\n')
    with pytest.raises(InputError, match=re.escape(f"{index}:1 lacks an integer 'shard'")):
        ShardDataset(data, ("speech_tokens",))
    with pytest.raises(InputError, match=re.escape(f"{index}:1 lacks shard/key/id/text/fields")):
        add_features(data, ManifestArraysExtractor(arrays), progress=False)


def test_extractor_returning_non_arrays_rejects_the_item_only(tmp_path):
    from cadenza.data.prepare import prepare
    from cadenza.data.shards import read_jsonl

    class Bad:
        name, fields = "bad", ("bad",)

        def __call__(self, utt):
            return {"bad": object() if utt.id == "u0" else np.ones(2, np.float32)}

    rows = []
    for i in range(2):
        sf.write(tmp_path / f"u{i}.wav", _speech(1.4, seed=i), SR)
        rows.append(json.dumps({"id": f"u{i}", "audio": f"u{i}.wav", "text": TEXT}))
    (tmp_path / "m.jsonl").write_text("\n".join(rows) + "\n")
    summary = prepare(tmp_path / "m.jsonl", "jsonl", tmp_path / "out", extractors=[Bad()], f0=False, progress=False)
    assert summary["accepted"] == 1
    (rejected,) = read_jsonl(tmp_path / "out" / "rejected.jsonl")
    assert rejected["id"] == "u0" and rejected["category"] == "extractor"
    assert "field 'bad' is not a numeric array (object" in rejected["reason"]
