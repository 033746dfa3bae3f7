"""Shared by the hostile-input sweeps of the entry points (issue #19, docs/hostile_input.md; the sweeps:
tests/cli/test_hostile_cli.py, test_hostile_training_inputs.py, test_hostile_data_inputs.py and
tests/api/test_hostile_api.py): the built-in model, a folder of hostile audio files, the CLI run in-process, a
speech-like test signal. tests/cli/conftest.py and tests/api/conftest.py import the fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import cadenza.api
from helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
SR = 24000
TEXT = "the quick brown fox number one"  # ~24 letters in 1.4 s: a speaking rate the data checks accept


def speech_like(seconds: float, sr: int = SR, f0: float = 140.0, seed: int = 0) -> np.ndarray:
    """A voiced, amplitude-modulated harmonic signal (speech-like enough for every check)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.05 * np.sin(2 * np.pi * 3 * t))) / sr
    wav = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t) ** 2)
    return (0.3 * wav + 0.003 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def tts() -> Iterator:
    """The built-in cadenza-tiny on one thread, closed after the module."""
    torch.set_num_threads(1)
    model = cadenza.api.load(None)
    yield model
    model.close()


@pytest.fixture(scope="module")
def audio(tmp_path_factory) -> dict[str, Path]:
    """The hostile (and two good) audio files in a folder of their own; name -> path."""
    d = tmp_path_factory.mktemp("audio")
    good = speech_like(1.4)
    files = {name: d / f"{name}.wav" for name in ("good", "zero", "one", "ten_min", "u8", "hz96", "stereo")}
    sf.write(files["good"], good, SR)
    sf.write(files["zero"], np.zeros(0, np.float32), SR)
    sf.write(files["one"], np.array([0.5], np.float32), SR)
    sf.write(files["ten_min"], np.tile(speech_like(1.0, 8000), 600), 8000, subtype="PCM_U8")  # 600 s, 4.8 MB
    sf.write(files["u8"], good, SR, subtype="PCM_U8")
    sf.write(files["hz96"], speech_like(1.4, 96000), 96000)
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
    """``cli(*argv) -> (exit code, stdout, stderr)``, in-process, with the shared built-in model ``tts``."""
    def load(path=None, voices_dir=None, **kwargs):  # opens the voice store as Cadenza.from_pretrained does
        if voices_dir is not None:
            from cadenza.voices import VoiceStore

            VoiceStore(voices_dir).close()
        return tts

    class KeptOpen(list):  # the CLI closes what it loaded; the shared model outlives each command
        def append(self, item) -> None:
            pass

    monkeypatch.setattr(cadenza.api, "load", load)
    monkeypatch.setattr("cadenza.cli.main._LOADED", KeptOpen())
    monkeypatch.delenv("CADENZA_VOICES_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", "/nonexistent-cadenza-test")  # no default voice store

    def run(*argv: str) -> tuple[int, str, str]:
        return run_cli(capsys, *argv)

    return run


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:") or ": error: " in line]
    assert len(lines) == 1, err
    return lines[0]
