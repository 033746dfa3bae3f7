"""``cadenza synth --speed --stream --timestamps`` end to end (a real process, the built-in model)."""

import json
import subprocess
import sys

import soundfile as sf

TEXT = "Please open the window."


def _cadenza(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cadenza", *args], capture_output=True, text=True, timeout=300)


def test_synth_streams_at_a_speed_and_writes_word_timestamps(tmp_path):
    out, words = tmp_path / "out.wav", tmp_path / "words.json"
    proc = _cadenza("synth", "--text", TEXT, "--seed", "3", "--speed", "1.5", "--stream", "--timestamps",
                    str(words), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    audio, sr = sf.read(out, dtype="float32")
    doc = json.loads(words.read_text())
    assert abs(doc["duration"] - audio.size / sr) < 1e-3
    assert [w["word"] for w in doc["words"]] == TEXT.split()
    assert all(a["end"] <= b["start"] for a, b in zip(doc["words"], doc["words"][1:]))
    assert 0 <= doc["words"][0]["start"] and doc["words"][-1]["end"] <= doc["duration"]
    proc = _cadenza("synth", "--text", TEXT, "--timestamps", str(tmp_path / "no" / "words.json"), "-o", str(out))
    assert proc.returncode != 0 and "--timestamps: no folder" in proc.stderr  # before the model loads
