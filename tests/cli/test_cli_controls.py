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


def test_synth_takes_a_speed_method(tmp_path):
    """``--speed-method wsola`` loads and speaks at the asked rate, and an unknown method is refused by name (that the
    method's samples come out is tests/api/test_controls.py's job)."""
    base, fast = tmp_path / "base.wav", tmp_path / "fast.wav"
    for speed, out, extra in (("1", base, ()), ("2", fast, ("--speed-method", "wsola"))):
        proc = _cadenza("synth", "--text", TEXT, "--seed", "3", "--speed", speed, *extra, "-o", str(out))
        assert proc.returncode == 0, proc.stderr
    a, sr = sf.read(base, dtype="float32")
    b, _ = sf.read(fast, dtype="float32")
    assert abs(b.size / a.size - 0.5) < 0.05
    proc = _cadenza("synth", "--text", TEXT, "--speed-method", "fast", "-o", str(base))
    assert proc.returncode != 0 and "--speed-method: invalid choice: 'fast'" in proc.stderr


def test_speed_method_choices_are_the_engines_and_serve_takes_them():
    from cadenza.cli.args import SPEED_METHODS
    from cadenza.cli.main import build_parser
    from cadenza.engine.stream_schedule import SPEED_METHODS as ENGINE_METHODS

    assert SPEED_METHODS == ENGINE_METHODS
    assert build_parser().parse_args(["serve", "--speed-method", "wsola"]).speed_method == "wsola"
    assert build_parser().parse_args(["serve"]).speed_method is None  # the model's own (cadenza.json, else auto)


def test_first_hop_reaches_the_cosyvoice2_stream_schedule(tmp_path):
    import cadenza
    from cadenza.builtin import builtin_model_dir
    from cadenza.cli.args import first_hop_argument
    from cadenza.cli.main import build_parser

    args = build_parser().parse_args(["serve", "--first-hop", "20"])
    schedule = first_hop_argument(args, builtin_model_dir())["stream_schedule"]
    assert schedule.first_hop_len == 20 and not schedule.first_hop_on_grid
    assert first_hop_argument(build_parser().parse_args(["serve"]), builtin_model_dir()) == {}
    # A folder that names its speed method keeps it with --first-hop.
    folder = tmp_path / "model"
    folder.mkdir()
    for item in builtin_model_dir().iterdir():
        if item.name != "cadenza.json":
            (folder / item.name).symlink_to(item)
    meta = json.loads((builtin_model_dir() / "cadenza.json").read_text())
    (folder / "cadenza.json").write_text(json.dumps({**meta, "speed_method": "wsola"}))
    with cadenza.load(folder, **first_hop_argument(args, folder)) as tts:
        assert tts.engine.schedule.speed_method == "wsola"
    out = tmp_path / "out.wav"
    proc = _cadenza("synth", "--text", TEXT, "--first-hop", "10", "--stream", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    audio, sr = sf.read(out, dtype="float32")
    assert audio.size / sr > 1.0 and abs(audio).max() > 0.05
    proc = _cadenza("synth", "--text", TEXT, "--first-hop", "0", "-o", str(out))
    assert proc.returncode != 0 and "--first-hop: must be from 1 to 100 tokens, got 0" in proc.stderr


def test_flow_cache_budget_argument():
    from cadenza.cli.main import build_parser

    parse = build_parser().parse_args
    assert parse(["serve"]).flow_cache_budget_mb == "auto"
    assert parse(["serve", "--flow-cache-budget-mb", "NONE"]).flow_cache_budget_mb is None
    assert parse(["serve", "--flow-cache-budget-mb", "2048"]).flow_cache_budget_mb == 2048.0
