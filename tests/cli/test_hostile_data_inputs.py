"""The hostile-input sweep of ``cadenza data prepare`` / ``extract`` (issue #19): manifests, entries, options,
output folders, interrupted and damaged preparations. Bad entries are rejected with reasons and the rest goes on;
bad arguments give exit code 2 and one ``error: ...`` line (docs/hostile_input.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from cadenza.errors import InputError
from hostile_entry_points import SR, TEXT, one_error_line, speech_like


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
        assert code == 2 and message in one_error_line(err) and str(manifest) in err, (name, err)
    lj = tmp_path / "lj"
    lj.mkdir()
    (lj / "metadata.csv").write_bytes(b"id|\xff\n")
    code, err = _prepare(cli, lj, out, "ljspeech")
    assert code == 2 and f"the LJSpeech metadata {lj / 'metadata.csv'} is not UTF-8 text" in err
    assert not out.exists()  # nothing written for a corpus that cannot be read


def test_prepare_hostile_entries_are_rejected_with_reasons(cli, tmp_path, audio):
    good = tmp_path / "good.wav"
    sf.write(good, speech_like(1.4), SR)
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
    sf.write(lj / "wavs" / "ok.wav", speech_like(1.4), SR)
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
    assert code == 2 and message in one_error_line(err), err
    assert not (tmp_path / "out").exists()


def test_prepare_hostile_output_folders(cli, tmp_path):
    good = tmp_path / "good.wav"
    sf.write(good, speech_like(1.4), SR)
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
        sf.write(tmp_path / f"u{i}.wav", speech_like(1.4, seed=i), SR)
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
        sf.write(tmp_path / f"u{i}.wav", speech_like(1.4, seed=i), SR)
        rows.append(json.dumps({"id": f"u{i}", "audio": f"u{i}.wav", "text": TEXT}))
    (tmp_path / "m.jsonl").write_text("\n".join(rows) + "\n")
    summary = prepare(tmp_path / "m.jsonl", "jsonl", tmp_path / "out", extractors=[Bad()], f0=False, progress=False)
    assert summary["accepted"] == 1
    (rejected,) = read_jsonl(tmp_path / "out" / "rejected.jsonl")
    assert rejected["id"] == "u0" and rejected["category"] == "extractor"
    assert "field 'bad' is not a numeric array (object" in rejected["reason"]
