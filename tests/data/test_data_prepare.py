"""``cadenza data prepare`` on LJSpeech / LibriTTS / JSONL corpora built here with synthetic speech-like audio,
including broken items (corrupt, silent, too short, missing, transcript that cannot fit), resume, sidecar features
and the shard dataset the stages read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from cadenza.audio.io import load_audio
from cadenza.audio.mel import flow_prompt_mel
from cadenza.data.dataset import ShardDataset
from cadenza.data.extractors import PCM_SCALE, load_extractor
from cadenza.data.prepare import add_features, prepare
from cadenza.data.shards import INDEX_FILE, REJECTED_FILE, done_file, read_jsonl
from cadenza.data.validate import DataLimits
from cadenza.errors import InputError
from cadenza.models.cosyvoice2.config import MelConfig

REPO = Path(__file__).resolve().parents[2]
TEXT = "the quick brown fox number {}"  # ~22 letters in 1.2-1.6 s: a plausible speaking rate


def _speech(seconds: float, sr: int, f0: float, seed: int) -> np.ndarray:
    """A voiced, amplitude-modulated harmonic signal (speech-like enough for every check)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    pitch = f0 * (1 + 0.05 * np.sin(2 * np.pi * 3 * t))
    phase = 2 * np.pi * np.cumsum(pitch) / sr
    wav = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t) ** 2
    return (0.3 * wav * envelope + 0.003 * rng.standard_normal(t.size)).astype(np.float32)


def _write(path: Path, wav: np.ndarray, sr: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, wav, sr)


def _bad_items(folder: Path, sr: int) -> dict[str, tuple[Path, str, str]]:
    """id -> (audio path, transcript, expected rejection category)."""
    items = {
        "bad_corrupt": (folder / "bad_corrupt.wav", TEXT.format("x"), "unreadable"),
        "bad_silent": (folder / "bad_silent.wav", TEXT.format("y"), "silent"),
        "bad_short": (folder / "bad_short.wav", TEXT.format("z"), "too_short"),
        "bad_missing": (folder / "bad_missing.wav", TEXT.format("w"), "missing"),
        "bad_mismatch": (folder / "bad_mismatch.wav", "word " * 60, "mismatch"),
        "bad_text": (folder / "bad_text.wav", "?!...", "text"),
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bad_corrupt.wav").write_bytes(b"RIFF\x00\x00garbage" + bytes(range(200)))
    _write(folder / "bad_silent.wav", np.zeros(sr, np.float32), sr)
    _write(folder / "bad_short.wav", _speech(0.2, sr, 150, 1), sr)
    _write(folder / "bad_mismatch.wav", _speech(1.0, sr, 150, 2), sr)
    _write(folder / "bad_text.wav", _speech(1.0, sr, 150, 3), sr)
    return items


def _ljspeech(root: Path, n_good: int = 5) -> dict[str, str]:
    sr = 22050
    expected = {}
    lines = []
    for i in range(n_good):
        uid = f"LJ001-{i:04d}"
        _write(root / "wavs" / f"{uid}.wav", _speech(1.2 + 0.1 * i, sr, 120 + 10 * i, i), sr)
        lines.append(f"{uid}|{TEXT.format(i)} raw|{TEXT.format(i)}")
        expected[uid] = "ok"
    for uid, (_, text, category) in _bad_items(root / "wavs", sr).items():
        lines.append(f"{uid}|{text}|{text}")
        expected[uid] = category
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return expected


def _check_output(out: Path, expected: dict[str, str]) -> None:
    index = read_jsonl(out / INDEX_FILE)
    rejected = read_jsonl(out / REJECTED_FILE)
    assert sorted(e["id"] for e in index) == sorted(k for k, v in expected.items() if v == "ok")
    got = {r["id"]: r["category"] for r in rejected}
    assert got == {k: v for k, v in expected.items() if v != "ok"}, rejected
    assert all(r["reason"] for r in rejected)
    summary = json.loads((out / "prepare.json").read_text())
    assert summary["accepted"] == len(index) and summary["rejected"] == len(rejected)


def test_ljspeech_layout_with_bad_items(tmp_path):
    corpus = tmp_path / "LJSpeech-1.1"
    expected = _ljspeech(corpus)
    summary = prepare(corpus, "ljspeech", tmp_path / "out", shard_size=4, progress=False)
    assert summary["complete"] and summary["processed_shards"] == summary["shards"] == 3
    _check_output(tmp_path / "out", expected)

    ds = ShardDataset(tmp_path / "out", ("mel", "wav", "f0"))
    assert len(ds) == 5
    item = ds[0]
    assert item["id"] == "LJ001-0000" and item["speaker"] == "LJ" and item["text"] == TEXT.format(0)
    wav24 = load_audio(corpus / "wavs" / "LJ001-0000.wav", 24000)
    assert item["wav"].dtype == torch.float32 and item["wav"].numel() == wav24.numel()
    assert float((item["wav"] - wav24).abs().max()) <= 1.0 / PCM_SCALE  # int16 storage
    mel = flow_prompt_mel(wav24, MelConfig())[0].T
    assert item["mel"].shape == (wav24.numel() // 480, 80)
    torch.testing.assert_close(item["mel"], mel)
    voiced = item["f0"][item["f0"] > 0]
    assert item["f0"].shape == (item["mel"].shape[0],) and voiced.numel() > 0.5 * item["f0"].numel()
    assert abs(float(voiced.median()) - 120.0) < 10.0  # the synthetic pitch is 120 Hz +- 5 %


def test_resume_skips_finished_shards(tmp_path):
    corpus = tmp_path / "LJSpeech-1.1"
    expected = _ljspeech(corpus)

    class Counting:
        name, fields = "count", ("frames",)

        def __init__(self):
            self.calls = 0

        def __call__(self, utt):
            self.calls += 1
            return {"frames": torch.tensor([utt.wav.numel() // 480])}

    counter = Counting()
    first = prepare(corpus, "ljspeech", tmp_path / "out", extractors=[counter], shard_size=4, progress=False, f0=False)
    assert counter.calls == 5 and first["processed_shards"] == 3  # bad items fail before any extractor runs

    again = prepare(corpus, "ljspeech", tmp_path / "out", extractors=[counter], shard_size=4, progress=False, f0=False)
    assert counter.calls == 5 and again["processed_shards"] == 0 and again["skipped_shards"] == 3

    done_file(tmp_path / "out", 1).unlink()  # as if the run had died while writing shard 1
    redo = prepare(corpus, "ljspeech", tmp_path / "out", extractors=[counter], shard_size=4, progress=False, f0=False)
    shard1_good = sum(1 for e in read_jsonl(tmp_path / "out" / INDEX_FILE) if e["shard"] == 1)
    assert redo["processed_shards"] == 1 and counter.calls == 5 + shard1_good
    _check_output(tmp_path / "out", expected)
    assert ShardDataset(tmp_path / "out", ("frames",))[0]["frames"].item() > 0

    with pytest.raises(Exception, match="different corpus"):
        prepare(corpus, "ljspeech", tmp_path / "out", shard_size=5, progress=False, f0=False)
    # the same corpus named another way (from its folder, with a trailing slash) is the same corpus: a resume
    import os

    here = os.getcwd()
    try:
        os.chdir(corpus)
        same = prepare(".", "ljspeech", tmp_path / "out", extractors=[counter], shard_size=4, progress=False, f0=False)
    finally:
        os.chdir(here)
    assert same["processed_shards"] == 0 and same["skipped_shards"] == 3
    same = prepare(f"{corpus}/", "ljspeech", tmp_path / "out", extractors=[counter], shard_size=4, progress=False,
                   f0=False)
    assert same["skipped_shards"] == 3


def test_libritts_layout(tmp_path):
    root = tmp_path / "LibriTTS" / "train-clean-100"
    sr = 24000
    expected = {}
    for spk in ("19", "26"):
        for j in range(2):
            uid = f"{spk}_198_{j:06d}_000000"
            wav = root / spk / "198" / f"{uid}.wav"
            _write(wav, _speech(1.3, sr, 140, j), sr)
            wav.with_suffix(".normalized.txt").write_text(TEXT.format(j), encoding="utf-8")
            expected[uid] = "ok"
    flac = root / "26" / "199" / "26_199_000000_000000.flac"  # LibriSpeech-style trees keep FLAC (was skipped unsaid)
    flac.parent.mkdir(parents=True, exist_ok=True)
    sf.write(flac, _speech(1.3, sr, 140, 5), sr)
    flac.with_suffix(".normalized.txt").write_text(TEXT.format(5), encoding="utf-8")
    expected[flac.stem] = "ok"
    orphan = root / "26" / "198" / "26_198_000009_000000.wav"
    _write(orphan, _speech(1.3, sr, 140, 9), sr)  # no transcript
    expected[orphan.stem] = "corpus"
    for uid, (path, text, category) in _bad_items(root / "40" / "222", sr).items():
        if not path.exists():
            continue  # LibriTTS items are found by their audio files: a missing one is simply not there
        target = path.with_name(f"40_222_{uid}.wav")
        path.rename(target)
        target.with_suffix(".normalized.txt").write_text(text, encoding="utf-8")
        expected[target.stem] = category
    prepare(root, "libritts", tmp_path / "out", shard_size=3, progress=False, f0=False)
    _check_output(tmp_path / "out", expected)
    speakers = {e["id"]: e["speaker"] for e in read_jsonl(tmp_path / "out" / INDEX_FILE)}
    assert speakers["19_198_000000_000000"] == "19" and speakers["26_198_000001_000000"] == "26"


def _jsonl_corpus(root: Path) -> dict[str, str]:
    sr = 16000
    expected, lines = {}, []
    for i in range(3):
        _write(root / "audio" / f"a{i}.flac", _speech(1.4, sr, 160, i), sr)
        lines.append(json.dumps({"id": f"a{i}", "audio": f"audio/a{i}.flac", "text": TEXT.format(i),
                                 "speaker": "alice" if i % 2 else "bob", "language": "en"}))
        expected[f"a{i}"] = "ok"
    lines.append("{not json")
    expected["manifest-000004"] = "corpus"
    lines.append(json.dumps({"id": "no_text", "audio": "audio/a0.flac"}))
    expected["no_text"] = "corpus"
    for uid, (path, text, category) in _bad_items(root / "audio", sr).items():
        lines.append(json.dumps({"id": uid, "audio": str(path.relative_to(root)), "text": text}))
        expected[uid] = category
    (root / "manifest.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return expected


def test_jsonl_layout_from_the_command_line(tmp_path):
    expected = _jsonl_corpus(tmp_path / "corpus")
    proc = subprocess.run(
        [sys.executable, "-m", "cadenza.cli.data", "prepare", "--corpus", str(tmp_path / "corpus" / "manifest.jsonl"),
         "--layout", "jsonl", "--out", str(tmp_path / "out"), "--shard-size", "4", "--no-progress"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stderr.strip().splitlines()[-1])["accepted"] == 3
    _check_output(tmp_path / "out", expected)
    entries = {e["id"]: e for e in read_jsonl(tmp_path / "out" / INDEX_FILE)}
    assert entries["a1"]["speaker"] == "alice" and entries["a0"]["language"] == "en"


def test_sidecar_features_and_pluggable_extractors(tmp_path):
    _jsonl_corpus(tmp_path / "corpus")
    prepare(tmp_path / "corpus", "jsonl", tmp_path / "out", shard_size=2, progress=False, f0=False)
    with pytest.raises(Exception, match="no item"):
        ShardDataset(tmp_path / "out", ("f0",))

    f0 = load_extractor("cadenza.data.extractors:F0Extractor")  # a factory called without argument
    assert add_features(tmp_path / "out", f0, progress=False)["failed"] == 0
    ds = ShardDataset(tmp_path / "out", ("mel", "f0"))
    assert len(ds) == 3 and ds[0]["f0"].shape == (ds[0]["mel"].shape[0],)

    class Flaky:
        name, fields = "flaky", ("energy",)

        def __call__(self, utt):
            if utt.id == "a1":
                raise RuntimeError("cannot")
            return {"energy": utt.wav.square().mean().reshape(1)}

    result = add_features(tmp_path / "out", Flaky(), progress=False)
    assert result["failed"] == 1
    assert read_jsonl(tmp_path / "out" / "rejected.flaky.jsonl")[0]["id"] == "a1"
    assert sorted(item["id"] for item in ShardDataset(tmp_path / "out", ("energy",))) == ["a0", "a2"]
    assert add_features(tmp_path / "out", Flaky(), progress=False)["processed_shards"] == 0  # resumable

    class FromEnergy:  # reads a field stored by an earlier extraction (``needs``)
        name, fields, needs = "louder", ("louder",), ("energy",)

        def __call__(self, utt):
            return {"louder": 2 * utt.stored["energy"]}

    result = add_features(tmp_path / "out", FromEnergy(), progress=False)
    assert result["failed"] == 1  # a1 has no stored energy: rejected with that reason, the others computed
    assert "lacks a stored field the extractor needs (energy)" in read_jsonl(
        tmp_path / "out" / "rejected.louder.jsonl")[0]["reason"]
    both = ShardDataset(tmp_path / "out", ("energy", "louder"))
    assert len(both) == 2 and all(torch.equal(it["louder"], 2 * it["energy"]) for it in both)

    class NeedsNothingStored(FromEnergy):
        name, needs = "louder2", ("pitch_marks",)

    with pytest.raises(InputError, match="'louder2' needs the stored fields pitch_marks.*extract those first"):
        add_features(tmp_path / "out", NeedsNothingStored(), progress=False)


def test_model_folder_fills_tokens_embeddings_and_text_ids(cv2_dir, tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from toy_model import build_toy_model_dir

    model = build_toy_model_dir(cv2_dir, tmp_path / "model")  # the shared fixture's Qwen vocabulary holds its BPE
    _jsonl_corpus(tmp_path / "corpus")
    # The toy tokenizer splits text almost per character: fewer speech tokens than text tokens, which the LM could
    # never produce (it emits >= 2 speech tokens per text token), so the default token-ratio check rejects them ...
    strict = prepare(tmp_path / "corpus", "jsonl", tmp_path / "strict", model_dir=model, shard_size=2,
                     progress=False, f0=False)
    assert strict["accepted"] == 0 and strict["rejected_by_category"]["mismatch"] == 4
    # ... and a relaxed limit accepts them.
    prepare(tmp_path / "corpus", "jsonl", tmp_path / "out", model_dir=model, shard_size=2, progress=False, f0=False,
            limits=DataLimits(min_token_text_ratio=0.5))
    ds = ShardDataset(tmp_path / "out", ("speech_tokens", "spk_emb", "text_ids", "mel"))
    assert len(ds) == 3
    item = ds[0]
    assert item["spk_emb"].shape == (192,) and item["speech_tokens"].dtype == torch.int32
    assert abs(item["speech_tokens"].numel() - item["mel"].shape[0] / 2) <= 2  # 25 Hz tokens, 50 Hz mel
    from cadenza.text.qwen_tokenizer import CosyVoice2Tokenizer

    assert item["text_ids"].tolist() == CosyVoice2Tokenizer(model / "CosyVoice-BlankEN").encode(item["text"])


def test_a_missing_field_says_how_to_get_it(tmp_path):
    """A corpus prepared with --no-wav has no waveform for the HiFT stage: the error says to prepare without it (it
    said --model or `cadenza data extract`, which add no waveform)."""
    corpus = tmp_path / "LJSpeech-1.1"
    _ljspeech(corpus)
    prepare(corpus, "ljspeech", tmp_path / "out", wav=False, f0=False, progress=False)
    with pytest.raises(InputError, match="none has \\['wav'\\]\\); .*ran with --no-wav: prepare again without it"):
        ShardDataset(tmp_path / "out", ("wav",))
    with pytest.raises(InputError, match="none has \\['speech_tokens'\\]\\); prepare with --model"):
        ShardDataset(tmp_path / "out", ("speech_tokens",))
