"""``cadenza data dpo-pairs`` end to end on the built-in model with the offline Whisper scorer: pairs written and read
back, seeds recorded (a resumed run regenerates the same pair from them), resume skips finished texts, and clear
errors for an empty manifest, bad lines and texts the model cannot say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadenza.cli.data import main as data_main
from cadenza.errors import InputError, TextError
from cadenza.training import preference_candidates as pc
from cadenza.training.dpo_pairs import read_pairs

pytest.importorskip("faster_whisper", reason="the default ASR scorer is in the 'eval' extra")

# A tongue-twister, so that the two candidates differ: a better-spoken model (the 2026-12-04 vocoder round) said
# "Good morning." right in both, leaving nothing to prefer; this one it said two ways (CER rewards 0.57 and 0.31).
TEXTS = [{"id": "hello", "text": "Quietly, the quizzical quokka queued."}, {"id": "noise", "text": "!!! ???"}]
ARGS = ["--candidates", "2", "--seed", "5", "--metric", "cer", "--min-gap", "0.01", "--no-similarity", "--no-progress"]


def _manifest(path: Path, entries: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    return path


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / pc.CANDIDATES_NAME).read_text().splitlines()]


@pytest.fixture(scope="module")
def scorer():
    return pc.WhisperTranscriber()


@pytest.fixture(scope="module")
def tts():
    import cadenza

    return cadenza.load()  # the built-in cadenza-tiny


def _settings(scorer) -> pc.PairSettings:
    """What ``ARGS`` on the command line amount to."""
    return pc.PairSettings(candidates=2, seed=5, min_gap=0.01, metric="cer", similarity_weight=0.0, asr=scorer.name)


@pytest.fixture(scope="module")
def made(tmp_path_factory, tts, scorer) -> dict:
    root = tmp_path_factory.mktemp("dpo_pairs")
    manifest = _manifest(root / "texts.jsonl", TEXTS)
    summary = pc.generate_pairs(tts, manifest, root / "out", _settings(scorer), scorer, progress=False)
    return {"summary": summary, "root": root, "manifest": manifest, "out": root / "out"}


def test_pairs_are_best_vs_worst_of_scored_candidates_and_read_back(made):
    assert made["summary"].pairs == 1 and made["summary"].by_status == {"paired": 1, "unspeakable": 1}
    log = {r["id"]: r for r in _log(made["out"])}
    assert list(log) == ["hello", "noise"]
    assert log["noise"]["status"] == "unspeakable" and "cannot say" in log["noise"]["reason"]
    (pair,) = read_pairs(made["out"] / pc.PAIRS_NAME)
    record = log["hello"]
    cands = record["candidates"]
    assert [c["seed"] for c in cands] == record["seeds"] and len(set(record["seeds"])) == 2
    for c in cands:  # the reward is 1 - CER of the Whisper transcript
        assert c["reward"] == pytest.approx(1 - min(1.0, pc.error_rate(record["text"], c["transcript"], "cer")))
        assert c["speech_tokens"] and c["seconds"] > 0.3
    best, worst = max(cands, key=lambda c: c["reward"]), min(cands, key=lambda c: c["reward"])
    assert pair["chosen"] == best["speech_tokens"] and pair["rejected"] == worst["speech_tokens"]
    assert (pair["chosen_seed"], pair["rejected_seed"]) == (best["seed"], worst["seed"])
    assert pair["chosen_reward"] - pair["rejected_reward"] >= 0.01 and pair["text"] == record["text"]
    assert pair["text_ids"] and all(isinstance(i, int) for i in pair["text_ids"])
    settings = json.loads((made["out"] / pc.SETTINGS_NAME).read_text())
    assert settings["candidates"] == 2 and settings["seed"] == 5 and "whisper" in settings["asr"]


def test_resume_regenerates_an_unfinished_text_from_its_seeds(made, tts, scorer):
    out = made["out"]
    log = _log(out)
    (before,) = read_pairs(out / pc.PAIRS_NAME)
    # a run stopped after writing hello's pair but before its log line, and mid-way through the next line
    kept = [json.dumps(r) + "\n" for r in log if r["id"] != "hello"]
    (out / pc.CANDIDATES_NAME).write_text("".join(kept) + '{"id": "torn', encoding="utf-8")
    summary = pc.generate_pairs(tts, made["manifest"], out, _settings(scorer), scorer, progress=False)
    assert (summary.texts, summary.skipped_done, summary.pairs) == (2, 1, 1)
    assert read_pairs(out / pc.PAIRS_NAME) == [before]  # no duplicate; the same seeds gave the same pair
    assert sorted(r["id"] for r in _log(out)) == ["hello", "noise"]


def test_cli_resumes_a_finished_folder_and_refuses_other_settings(made, tts, monkeypatch, capsys):
    import cadenza

    asked = []
    monkeypatch.setattr(cadenza, "load", lambda path=None: asked.append(path) or tts)  # the model already loaded
    args = ["dpo-pairs", "--manifest", str(made["manifest"]), "--out", str(made["out"])]
    assert data_main([*args, *ARGS]) == 0 and asked == [None]
    summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert summary == {"texts": 2, "skipped_done": 2, "pairs": 0, "by_status": {}}
    assert data_main([*args, ARGS[0], "3", *ARGS[2:]]) == 2
    assert "other settings (candidates differ)" in capsys.readouterr().err


def test_bad_manifests_are_refused_before_any_model_is_loaded(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert data_main(["dpo-pairs", "--manifest", str(empty), "--out", str(tmp_path / "o"), *ARGS]) == 2
    assert "holds no texts" in capsys.readouterr().err and not (tmp_path / "o").exists()
    for lines, message in ((['{"id": "a"}'], "'text' is missing"), (["{not json"], "not valid JSON"),
                           (['{"id": "a", "text": "x"}', '{"id": "a", "text": "y"}'], "appears twice"),
                           (['{"text": "x", "prompt_wav": "nowhere.wav"}'], "prompt_wav not found")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text("\n".join(lines) + "\n")
        assert data_main(["dpo-pairs", "--manifest", str(bad), "--out", str(tmp_path / "o"), *ARGS]) == 2
        err = capsys.readouterr().err
        assert message in err and "line" in err and not (tmp_path / "o").exists(), err
    assert data_main(["dpo-pairs", "--manifest", str(empty), "--out", str(tmp_path / "o"), "--candidates", "1"]) == 2
    assert "at least 2 candidates" in capsys.readouterr().err


def test_plain_text_manifest_and_settings_checks(tmp_path):
    txt = tmp_path / "texts.txt"
    txt.write_text("# a comment\nFirst text.\n\nSecond one.\n")
    lines = list(pc.read_manifest(txt))
    assert [(x.id, x.text, x.index, x.line) for x in lines] == [("line2", "First text.", 0, 2),
                                                                ("line4", "Second one.", 1, 4)]
    with pytest.raises(InputError, match="candidates must be an integer >= 2"):
        pc.PairSettings(candidates=1)
    with pytest.raises(InputError, match="metric"):
        pc.PairSettings(metric="bleu")
    with pytest.raises(TextError, match="no words"):
        pc.error_rate("?!", "hello", "wer")
    assert pc.error_rate("the cat sat", "the cat sat down", "wer") == pytest.approx(1 / 3)
    assert pc.candidate_reward(0.25, 0.8, 0.5) == pytest.approx(1.15)
    assert pc.candidate_reward(0.25, None, 0.5) == pytest.approx(0.75)
    assert pc.candidate_reward(11.7, None, 0.5) == pc.candidate_reward(1.0, None, 0.5) == 0.0  # a looping transcript
    with pytest.raises(InputError, match="did not return a ASR scorer|must look like"):
        pc.load_plugin("cadenza.training.preference_candidates", "ASR", pc.Transcriber)


def test_a_manifest_the_model_cannot_say_is_an_error_naming_the_texts(tmp_path, tts, scorer):
    from cadenza.errors import CadenzaError

    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "dots", "text": "..."}, {"id": "marks", "text": "?! ?!"}])
    with pytest.raises(CadenzaError, match="no preference pair was made.*dots: the model cannot say it"):
        pc.generate_pairs(tts, manifest, tmp_path / "out", _settings(scorer), scorer, progress=False)
    assert [r["status"] for r in _log(tmp_path / "out")] == ["unspeakable", "unspeakable"]
