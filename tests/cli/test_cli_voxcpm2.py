"""The CLI on a VoxCPM 2 folder: family detection, design, clone, and the errors of each. The plain synth runs as
a real ``python -m cadenza`` process; the rest in-process (``cli``), which checks the same code without paying for
a fresh interpreter and model load per call."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import soundfile as sf

from helpers import run_cli


def _cadenza(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cadenza", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def cli(monkeypatch, capsys):
    """``cli(*argv)`` -> ``returncode``, ``stdout``, ``stderr`` of ``cadenza`` run in this process (no default voice
    store)."""
    monkeypatch.delenv("CADENZA_VOICES_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", "/nonexistent-cadenza-test")

    def run(*argv: str) -> SimpleNamespace:
        code, out, err = run_cli(capsys, *argv)
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


def test_synth_design_and_clone(vx2_model_dir, tmp_path, cli):
    ref = vx2_model_dir.parent / "wavs" / "ref_16k.wav"
    runs = {
        "plain": ("synth", "--text", "Hello there.", "--seed", "1"),
        "design": ("design", "--text", "(A calm, low voice)Hello there.", "--seed", "1"),
        "clone": ("clone", "--text", "Hello there.", "--reference-wav", str(ref), "--seed", "1", "--stream"),
    }
    for name, args in runs.items():
        out = tmp_path / f"{name}.wav"
        run = _cadenza if name == "plain" else cli
        proc = run(args[0], "--model", str(vx2_model_dir), *args[1:], "-o", str(out))
        assert proc.returncode == 0, (name, proc.stderr)
        info = sf.info(out)
        assert info.samplerate == 48000 and info.frames > 0, name


def test_speakers_lists_a_voxcpm2_model_s_saved_voices(vx2_model_dir, tmp_path, cli):
    """``cadenza speakers --model VX2`` crashed (the family has no speakers of its own): it lists the saved voices."""
    ref = vx2_model_dir.parent / "wavs" / "ref_16k.wav"
    consent = "I am the speaker in this recording and I agree to it being used."
    made = cli("voices", "--voices-dir", str(tmp_path / "v"), "add", "ada", "--audio", str(ref), "--consent", consent,
               "--model", str(vx2_model_dir))
    assert made.returncode == 0, made.stderr
    listed = cli("speakers", "--model", str(vx2_model_dir), "--voices-dir", str(tmp_path / "v"))
    assert listed.returncode == 0 and listed.stdout.split() == ["ada"], listed.stderr


def test_family_specific_errors(vx2_model_dir, cv2_dir, tmp_path, cli):
    out = str(tmp_path / "x.wav")
    proc = cli("synth", "--model", str(vx2_model_dir), "--text", "Hi there.", "--instruct", "cheerful", "-o", out)
    assert proc.returncode == 2 and "VoxCPM 2 models do not take instruct" in proc.stderr
    assert "(description)text" in proc.stderr
    proc = cli("synth", "--model", str(vx2_model_dir), "--text", "Hi there.", "--speed", "2.5", "-o", out)
    assert proc.returncode == 2 and "speed must be between 0.5 and 2.0" in proc.stderr
    proc = cli("design", "--model", str(cv2_dir), "--text", "(calm)Hi.", "-o", out)
    assert proc.returncode == 2 and "(VoxCPM 2)" in proc.stderr and "--instruct" in proc.stderr
    proc = cli("design", "--model", str(vx2_model_dir), "--text", "Hi there.", "-o", out)
    assert proc.returncode == 2 and "description in parentheses" in proc.stderr
    ref = str(vx2_model_dir.parent / "wavs" / "ref_16k.wav")
    proc = cli("clone", "--model", str(vx2_model_dir), "--text", "Hi.", "--prompt-wav", ref, "-o", out)
    assert proc.returncode == 2 and "--prompt-text" in proc.stderr
