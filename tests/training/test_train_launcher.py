"""The training launcher end to end on tiny synthetic data: the lm, dpo and flow stages learn, checkpoints resume to
the same loss curve, two DDP processes (gloo, CPU) train like one process with the doubled batch, and the exported
pieces assemble into a folder ``Cadenza.from_pretrained`` serves."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from cadenza.data.shards import write_prepared
from cadenza.errors import InputError
from cadenza.training.checkpoint import list_checkpoints, load_checkpoint
from cadenza.training.config import load_config_file
from cadenza.training.dpo_pairs import write_pairs
from cadenza.training.launcher import train
from cadenza.training.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs" / "train"
STAGES = ("lm", "dpo", "flow")
STEPS = 30
# mean(last 5 losses) / mean(first 3) must be below this: the LM and DPO fall fast; the flow-matching loss of a tiny
# U-Net falls slowly at first (its floor is far below, see docs/training.md) but deterministically.
FALL = {"lm": 0.85, "dpo": 0.85, "flow": 0.97}


def _model_section() -> dict:
    return load_config_file(CONFIGS / "lm_tiny.yaml")["model"]


def _sizes() -> tuple[int, int]:
    model = _model_section()
    return model["qwen"]["vocab_size"], model["overrides"]["llm"]["speech_token_size"]


def _lm_records(n: int, seed: int) -> list[tuple[dict, dict]]:
    """Speech tokens that are a fixed function of the text (4 per text token: long enough for bistream)."""
    text_vocab, speech_vocab = _sizes()
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        text = [rng.randrange(1, text_vocab) for _ in range(rng.randint(4, 12))]
        speech = [(t * k) % speech_vocab for t in text for k in (1, 3, 7, 11)]
        recs.append(({"id": f"u{i:03d}", "text": "synthetic", "speaker": f"s{i % 3}"},
                     {"text_ids": torch.tensor(text, dtype=torch.int32),
                      "speech_tokens": torch.tensor(speech, dtype=torch.int32)}))
    return recs


def _flow_records(n: int, seed: int) -> list[tuple[dict, dict]]:
    """Mel frames = a fixed table of the speech tokens (2 frames per token) + noise; random x-vectors."""
    _, speech_vocab = _sizes()
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(speech_vocab, 2, 80, generator=g)
    recs = []
    for i in range(n):
        k = int(torch.randint(20, 60, (1,), generator=g))
        tok = torch.randint(0, speech_vocab, (k,), generator=g)
        mel = table[tok].reshape(2 * k, 80) + 0.1 * torch.randn(2 * k, 80, generator=g)
        recs.append(({"id": f"u{i:03d}", "text": "synthetic"},
                     {"speech_tokens": tok.int(), "mel": mel, "spk_emb": torch.randn(192, generator=g)}))
    return recs


def _pairs(n: int, seed: int) -> list[dict]:
    _, speech_vocab = _sizes()
    rng = random.Random(seed)
    pairs = []
    for entry, arrays in _lm_records(n, seed):
        chosen = arrays["speech_tokens"].tolist()
        pairs.append({"id": entry["id"], "text_ids": arrays["text_ids"].tolist(), "chosen": chosen,
                      "rejected": [rng.randrange(speech_vocab) for _ in chosen]})
    return pairs


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train_data")
    write_prepared(root / "lm", _lm_records(32, 0), shard_size=10)
    write_prepared(root / "flow", _flow_records(32, 1), shard_size=10)
    (root / "dpo").mkdir()
    write_pairs(root / "dpo" / "preference_pairs.jsonl", _pairs(32, 2))
    return {"lm": root / "lm", "flow": root / "flow", "dpo": root / "dpo"}


def _train(stage: str, data_dir: Path, out: Path, **kwargs) -> list[dict]:
    torch.set_num_threads(1)  # tiny models: threads only contend on a shared CPU
    train(stage, CONFIGS / f"{stage}_tiny.yaml", data_dir, out, **kwargs)
    return read_metrics(out)


@pytest.fixture(scope="module")
def full_runs(data, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train_runs")
    for stage in STAGES:
        _train(stage, data[stage], root / stage, max_steps=STEPS)
    return {stage: root / stage for stage in STAGES}


@pytest.mark.parametrize("stage", STAGES)
def test_loss_falls(stage, full_runs):
    metrics = read_metrics(full_runs[stage])
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    losses = np.array([m["loss"] for m in metrics])
    assert np.isfinite(losses).all()
    first, last = losses[:3].mean(), losses[-5:].mean()
    assert last < FALL[stage] * first, f"{stage}: loss {first:.3f} -> {last:.3f}"
    if stage == "dpo":  # starts at ln 2 (policy == reference) and the policy learns to prefer the chosen tokens
        assert metrics[0]["dpo_loss"] == pytest.approx(np.log(2), abs=1e-5)
        assert metrics[-1]["dpo_loss"] < 0.6 and metrics[-1]["reward_acc"] == 1.0


@pytest.mark.parametrize("stage", STAGES)
def test_checkpoints_are_plain_data(stage, full_runs):
    ckpts = list_checkpoints(full_runs[stage])
    assert [s for s, _ in ckpts] == [10, 20, 30]
    ckpt = load_checkpoint(ckpts[-1][1])  # weights_only=True inside
    assert ckpt["step"] == 30 and ckpt["stage"] == stage and len(ckpt["rng"]) == 1
    exported = "flow.pt" if stage == "flow" else "llm.pt"
    assert (full_runs[stage] / exported).is_file() and (full_runs[stage] / "cosyvoice2.yaml").is_file()


@pytest.mark.parametrize("stage", STAGES)
def test_resume_continues_the_same_loss_curve(stage, data, full_runs, tmp_path):
    out = tmp_path / stage
    _train(stage, data[stage], out, max_steps=10)
    metrics = _train(stage, data[stage], out, max_steps=20, resume=True)
    reference = read_metrics(full_runs[stage])[:20]
    assert [m["step"] for m in metrics] == list(range(1, 21))
    for got, want in zip(metrics, reference):
        assert abs(got["loss"] - want["loss"]) <= 1e-6, (got["step"], got["loss"], want["loss"])


def test_resume_on_other_data_is_said(data, tmp_path, caplog):
    """The checkpoint names the data it trained on; a resume that reads another folder warns (it went on silently,
    no longer continuing the same epochs)."""
    out = tmp_path / "lm"
    _train("lm", data["lm"], out, max_steps=2)
    assert load_checkpoint(list_checkpoints(out)[-1][1])["data"] == str(Path(data["lm"]).resolve())
    other = tmp_path / "other"
    shutil.copytree(data["lm"], other)
    with caplog.at_level("WARNING", logger="cadenza.training.launcher"):
        _train("lm", other, out, max_steps=3, resume=True)
    assert f"this run reads {other.resolve()}" in caplog.text


def test_fresh_run_refuses_a_folder_with_checkpoints(data, full_runs):
    with pytest.raises(InputError, match="--resume"):
        _train("lm", data["lm"], full_runs["lm"], max_steps=STEPS)


def test_two_ddp_processes_match_one_process_with_the_doubled_batch(data, tmp_path):
    """torchrun --nproc_per_node 2 (gloo on the CPU), batch 2 per process == one process with batch 4."""
    steps = 6
    config = load_config_file(CONFIGS / "flow_tiny.yaml")
    config["train"].update(batch_size=2, max_steps=steps, ckpt_every=steps)
    (tmp_path / "ddp.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "cadenza.cli.train", "flow", "--config", str(tmp_path / "ddp.yaml"), "--data", str(data["flow"]),
         "--out", str(tmp_path / "ddp")],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    config["train"]["batch_size"] = 4
    single = _train("flow", data["flow"], tmp_path / "single", config_overrides={"train": config["train"]})
    ddp = read_metrics(tmp_path / "ddp")
    assert len(ddp) == steps  # rank 0 alone writes
    for a, b in zip(ddp, single):
        assert a["step"] == b["step"] and abs(a["loss"] - b["loss"]) <= 1e-5, (a, b)
    assert load_checkpoint(tmp_path / "ddp" / "checkpoints" / f"step_{steps}.pt")["world_size"] == 2


def test_exported_pieces_assemble_into_a_servable_folder(full_runs, tmp_path):
    from cadenza import Cadenza
    from cadenza.models.cosyvoice2.hift import HiFTGenerator
    from cadenza.training.export import assemble_model_dir
    from cadenza.training.model_files import resolve_model, write_model_config

    cfg = resolve_model(_model_section()).config
    hift_dir = tmp_path / "hift_stage"  # stands in for the hift stage's output
    torch.manual_seed(0)
    hift_dir.mkdir()
    torch.save(HiFTGenerator(cfg.hift).state_dict(), hift_dir / "hift.pt")
    write_model_config(hift_dir, cfg)
    out = assemble_model_dir(full_runs["lm"], full_runs["flow"], hift_dir, out=tmp_path / "model")
    for name in ("llm.pt", "flow.pt", "hift.pt"):
        assert (out / name).read_bytes() == next(d / name for d in (full_runs["lm"], full_runs["flow"], hift_dir)
                                                 if (d / name).is_file()).read_bytes()
    tts = Cadenza.from_pretrained(out)
    audio = tts.synthesize(text_ids=[5, 17, 42, 9], seed=1)
    assert audio.sample_rate == cfg.sample_rate and audio.duration > 0
    assert np.isfinite(np.asarray(audio.samples)).all()
    with pytest.raises(InputError, match="no source has"):
        assemble_model_dir(full_runs["lm"], out=tmp_path / "incomplete")
    shutil.rmtree(tmp_path / "incomplete", ignore_errors=True)
    assert json.loads((out / "CosyVoice-BlankEN" / "config.json").read_text())["hidden_size"] == cfg.lm.qwen.hidden_size


def test_lm_fine_tuning_with_speaker_tags_from_a_model_folder(cv2_dir, tmp_path):
    """mSFT: '<speaker><|endofprompt|>' + transcript, tokenised on the fly; weights and sizes from a model folder."""
    from cadenza.models.cosyvoice2.loader import inspect_directory, load_cosyvoice2_weights
    from cadenza.text.qwen_tokenizer import ENDOFPROMPT, CosyVoice2Tokenizer
    from cadenza.training.model_files import resolve_model
    from cadenza.training.registry import get_stage

    from toy_model import _tokenizer_files, build_toy_model_dir

    # A fixture whose Qwen vocabulary cannot hold a byte-level BPE raises ValueError here: a failure, not a skip.
    model = build_toy_model_dir(cv2_dir, tmp_path / "model", with_frontend=False)
    blank = model / "CosyVoice-BlankEN"
    _tokenizer_files(blank, json.loads((blank / "config.json").read_text())["vocab_size"] - 20)
    speech_vocab = resolve_model({"dir": str(model)}).config.lm.speech_token_size
    rng = random.Random(3)
    recs = [({"id": f"u{i}", "text": f"hello number {i}", "speaker": "s0" if i % 2 else "s1"},
             {"speech_tokens": torch.tensor([rng.randrange(speech_vocab) for _ in range(40)], dtype=torch.int32)})
            for i in range(8)]
    write_prepared(tmp_path / "data", recs)
    config = load_config_file(CONFIGS / "lm_tiny.yaml")
    config["model"] = {"dir": str(model)}
    config["lm"] = {"speaker_tags": True, "speaker_names": {"s0": "Speaker A"}, "init_llm": str(model)}
    config["train"].update(max_steps=3, ckpt_every=3)
    metrics = _train("lm", tmp_path / "data", tmp_path / "out", config_overrides=config)
    assert len(metrics) == 3 and np.isfinite([m["loss"] for m in metrics]).all()

    tok = CosyVoice2Tokenizer(blank)
    stage = get_stage("lm")(config, tmp_path / "data")
    item = stage.dataset()[1]
    assert item["text_ids"] == tok.encode("hello number 1")
    assert stage.text_ids(item, 0.5) == tok.encode("Speaker A" + ENDOFPROMPT) + item["text_ids"]
    assert stage.text_ids({**item, "speaker": "s1"}, 0.5)[: len(tok.encode("unknown" + ENDOFPROMPT))] == \
        tok.encode("unknown" + ENDOFPROMPT)
    # the export carries the tokenizer files, so the folder serves text input once flow/hift join it
    assert (tmp_path / "out" / "CosyVoice-BlankEN" / "vocab.json").is_file()
    shutil.copyfile(model / "flow.pt", tmp_path / "out" / "flow.pt")
    shutil.copyfile(model / "hift.pt", tmp_path / "out" / "hift.pt")
    load_cosyvoice2_weights(inspect_directory(tmp_path / "out"))  # strict keys
