"""The CLI on a VoxCPM 2 folder: family detection, design, clone, and the errors of each."""

from __future__ import annotations

import subprocess
import sys

import soundfile as sf


def _cadenza(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cadenza", *args], capture_output=True, text=True, timeout=300)


def test_synth_design_and_clone(vx2_model_dir, tmp_path):
    ref = vx2_model_dir.parent / "wavs" / "ref_16k.wav"
    runs = {
        "plain": ("synth", "--text", "Hello there.", "--seed", "1"),
        "design": ("design", "--text", "(A calm, low voice)Hello there.", "--seed", "1"),
        "clone": ("clone", "--text", "Hello there.", "--reference-wav", str(ref), "--seed", "1", "--stream"),
    }
    for name, args in runs.items():
        out = tmp_path / f"{name}.wav"
        proc = _cadenza(args[0], "--model", str(vx2_model_dir), *args[1:], "-o", str(out))
        assert proc.returncode == 0, (name, proc.stderr)
        info = sf.info(out)
        assert info.samplerate == 48000 and info.frames > 0, name


def test_family_specific_errors(vx2_model_dir, cv2_dir, tmp_path):
    out = str(tmp_path / "x.wav")
    proc = _cadenza("synth", "--model", str(vx2_model_dir), "--text", "Hi there.", "--instruct", "cheerful", "-o", out)
    assert proc.returncode == 2 and "VoxCPM 2 models do not take instruct" in proc.stderr
    assert "(description)text" in proc.stderr
    proc = _cadenza("synth", "--model", str(vx2_model_dir), "--text", "Hi there.", "--speed", "2.5", "-o", out)
    assert proc.returncode == 2 and "speed must be between 0.5 and 2.0" in proc.stderr
    proc = _cadenza("design", "--model", str(cv2_dir), "--text", "(calm)Hi.", "-o", out)
    assert proc.returncode == 2 and "(VoxCPM 2)" in proc.stderr and "--instruct" in proc.stderr
    proc = _cadenza("design", "--model", str(vx2_model_dir), "--text", "Hi there.", "-o", out)
    assert proc.returncode == 2 and "description in parentheses" in proc.stderr
    ref = str(vx2_model_dir.parent / "wavs" / "ref_16k.wav")
    proc = _cadenza("clone", "--model", str(vx2_model_dir), "--text", "Hi.", "--prompt-wav", ref, "-o", out)
    assert proc.returncode == 2 and "--prompt-text" in proc.stderr
