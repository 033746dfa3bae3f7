"""The token reader (the L_ASR backend for tokenizers without FSQ codes) and its stage: it learns to read a toy
corpus's tokens as their transcripts (held-out CTC loss and CER fall), resumes on the same curve, its soft lookup is
its id lookup, L_ASR through it moves only the LM (the reader stays bit-for-bit frozen), and bad configs, other
vocabularies and half-written folders are refused with messages that name the problem."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from cadenza.data.shards import write_prepared
from cadenza.errors import CheckpointError, InputError
from cadenza.training.asr_reward import load_asr_backend
from cadenza.training.config import load_config_file
from cadenza.training.launcher import train
from cadenza.training.lm_model import targets_of
from cadenza.training.metrics import read_metrics
from cadenza.training.registry import get_stage
from cadenza.training.token_reader import TokenReader, TokenReaderConfig, load_token_reader

REPO = Path(__file__).resolve().parents[2]
READER_CONFIG = REPO / "configs" / "train" / "token_reader_tiny.yaml"
ASR_CONFIG = REPO / "configs" / "train" / "asr_reward_tiny.yaml"
WORDS = ["a cab", "bad ace", "dab", "bead", "cede a bed", "add a cab", "be", "deed", "ebb", "dace"]
STEPS = 100


def _records(n: int, seed: int, codebook: int = 25) -> list[tuple[dict, dict]]:
    """Transcripts with text ids and speech tokens that are functions of their characters (2 tokens each)."""
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        text = rng.choice(WORDS)
        recs.append(({"id": f"u{i:03d}", "text": text},
                     {"text_ids": torch.tensor([3 + ord(c) % 90 for c in text], dtype=torch.int32),
                      "speech_tokens": torch.tensor([(ord(c) * k) % codebook for c in text for k in (1, 7)],
                                                    dtype=torch.int32)}))
    return recs


def _reader_overrides(**section) -> dict:
    config = load_config_file(READER_CONFIG)
    return {"token_reader": {**config["token_reader"], **section}}


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> dict[str, Path]:
    torch.set_num_threads(1)  # toy sizes: threads only contend on a shared CPU; and bit-for-bit resume
    root = tmp_path_factory.mktemp("token_reader")
    write_prepared(root / "lm", _records(80, 0), shard_size=40)
    train("token_reader", READER_CONFIG, root / "lm", root / "reader")
    return {"root": root, "lm": root / "lm", "reader": root / "reader"}


def test_reader_learns_to_read_the_tokens_of_held_out_items(toy):
    metrics = read_metrics(toy["reader"])
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(m["ctc_feasible"] == 1.0 for m in metrics)
    first, last = metrics[0]["loss"], sum(m["loss"] for m in metrics[-10:]) / 10
    assert first > 2.0 and last < 0.25 * first, (first, last)  # nats per character: measured 5.4 -> 0.06
    evals = [m for m in metrics if "heldout_ctc" in m]
    assert [m["step"] for m in evals] == [50, 100] and evals[0]["heldout_items"] == 8.0  # 10 % of 80
    doc = json.loads((toy["reader"] / "token_reader.json").read_text())
    assert doc["metadata"]["heldout_cer"] < 0.1 and doc["metadata"]["heldout_ctc"] < 0.5, doc["metadata"]
    assert doc["config"]["codebook_size"] == 25 and doc["config"]["vocab_size"] == 2 + len(set("".join(WORDS)))
    # what the export says is what the loaded reader does: greedy-decode a held-out item
    reader, vocab, _ = load_token_reader(toy["reader"])
    tokens = torch.tensor([[(ord(c) * k) % 25 for c in "cede a bed" for k in (1, 7)]])
    with torch.no_grad():
        best = reader(tokens, torch.ones_like(tokens, dtype=torch.bool)).argmax(-1)[0]
    assert vocab.decode([i for i in torch.unique_consecutive(best).tolist() if i]) == "cede a bed"


def test_resume_continues_the_same_curve(toy, tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "resumed"
    train("token_reader", READER_CONFIG, toy["lm"], out, max_steps=50)
    train("token_reader", READER_CONFIG, toy["lm"], out, resume=True)
    full, resumed = read_metrics(toy["reader"]), read_metrics(out)
    assert [m["step"] for m in resumed] == list(range(1, STEPS + 1))
    for a, b in zip(full[50:], resumed[50:]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
    assert resumed[-1]["heldout_cer"] == pytest.approx(full[-1]["heldout_cer"])


def test_soft_lookup_of_one_hot_rows_is_the_id_lookup():
    torch.manual_seed(0)
    reader = TokenReader(TokenReaderConfig(codebook_size=25, vocab_size=7, hidden_size=16, num_heads=2, ffn_size=32,
                                           num_layers=1, frames_per_token=3)).eval()
    ids = torch.randint(0, 25, (2, 6))
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    with torch.no_grad():
        by_id = reader(ids, mask)
        by_probs = reader(torch.nn.functional.one_hot(ids, 25).float(), mask)
    assert by_id.shape == (2, 18, 7)  # three frames per token
    assert torch.allclose(by_id, by_probs, atol=1e-6)
    assert reader.output_mask(mask)[1].tolist() == [True] * 12 + [False] * 6


# -- L_ASR through a reader -------------------------------------------------------------------------------------

def _asr_stage(data: Path, reader: Path, **section):
    config = load_config_file(ASR_CONFIG)
    config["asr_reward"] = {**config["asr_reward"], "tokenizer": None, "reader": str(reader), **section}
    stage = get_stage("asr_reward")(config, data)
    torch.manual_seed(config["train"]["seed"])
    stage.setup(torch.device("cpu"), lambda m: m)
    return stage


def test_l_asr_through_a_reader_moves_the_lm_only(toy):
    torch.set_num_threads(1)
    stage = _asr_stage(toy["lm"], toy["reader"], heldout_fraction=0.1, eval_every=1, eval_max_items=8)
    reader = stage.backend.model
    assert isinstance(reader, TokenReader) and not reader.training
    assert all(not p.requires_grad for p in reader.parameters())
    before = {k: v.clone() for k, v in reader.state_dict().items()}
    train_items = stage.dataset()
    assert len(train_items) == 72 and len(stage.heldout_idx) == 8
    items = [train_items[i] for i in range(4)]
    b = stage.to_batch([stage.sequence(it, it["text_ids"], it["speech_tokens"], 1.0) for it in items])
    select, targets, rows = targets_of(b)
    logits = stage.model(b.kinds, b.ids, select)
    loss, feasible, _ = stage.asr_loss(logits, targets, rows, 4, [stage.labels(it["text"], it["id"]) for it in items])
    assert feasible.all() and loss > 0
    loss.backward()
    head = dict(stage.lm.named_parameters())["llm_decoder.weight"].grad
    assert head is not None and head.abs().sum() > 0
    assert all(p.grad is None for p in reader.parameters())
    stage.lm.zero_grad()
    evals = [stage.train_step([train_items[i] for i in range(4 * s, 4 * s + 4)], s) for s in range(3)]
    assert all(torch.equal(before[k], v) for k, v in reader.state_dict().items())
    # held-out L_ASR: fixed draws, so a repeat on the same LM gives the same figure
    assert all(0 < e["heldout_asr_loss"] < 20 and e["heldout_items"] == 8 for e in evals)
    assert stage.evaluate()["heldout_asr_loss"] == stage.evaluate()["heldout_asr_loss"]


def test_l_asr_through_a_reader_lowers_the_held_out_reward_loss(toy, tmp_path):
    """A short asr_reward run from a random LM, graded by the toy reader: the held-out L_ASR falls."""
    torch.set_num_threads(1)
    config = load_config_file(ASR_CONFIG)
    section = {**config["asr_reward"], "tokenizer": None, "reader": str(toy["reader"]), "heldout_fraction": 0.1,
               "eval_every": 15, "eval_max_items": 8}
    train_cfg = {**config["train"], "optim": {**config["train"]["optim"], "lr": 1.0e-2}}
    train("asr_reward", ASR_CONFIG, toy["lm"], tmp_path / "run", max_steps=30,
          config_overrides={"asr_reward": section, "train": train_cfg})
    evals = [m["heldout_asr_loss"] for m in read_metrics(tmp_path / "run") if "heldout_asr_loss" in m]
    start = _asr_stage(toy["lm"], toy["reader"], heldout_fraction=0.1, eval_max_items=8)
    start.dataset()
    before = start.evaluate()["heldout_asr_loss"]
    assert len(evals) == 2 and evals[-1] < 0.8 * before, (before, evals)  # measured 5.16 -> 4.66 -> 3.12


# -- refusals ---------------------------------------------------------------------------------------------------

def test_refuses_a_reader_of_another_vocabulary(toy, tmp_path):
    write_prepared(tmp_path / "lm30", _records(20, 1, codebook=30), shard_size=20)
    train("token_reader", READER_CONFIG, tmp_path / "lm30", tmp_path / "reader30", max_steps=2,
          config_overrides=_reader_overrides(model={"codebook_size": 30, "hidden_size": 16, "num_heads": 2,
                                                    "ffn_size": 32, "num_layers": 1}, eval_every=0))
    with pytest.raises(InputError, match="token reader at .* has 30 token ids but the LM speaks 25"):
        _asr_stage(toy["lm"], tmp_path / "reader30")
    # a corpus whose tokens do not fit the reader's codebook is refused naming the item
    with pytest.raises(InputError, match=r"item 'u\d+': speech token 2\d outside \[0, codebook_size=20\)"):
        train("token_reader", READER_CONFIG, tmp_path / "lm30", tmp_path / "reader20", max_steps=2,
              config_overrides=_reader_overrides(model={"codebook_size": 20}))


@pytest.mark.parametrize(("section", "message"), [
    ({"model": {}}, "codebook_size is required"),
    ({"model": {"codebook_size": 25, "vocab_size": 9}}, "vocab_size is set from the training transcripts"),
    ({"model": {"codebook_size": 25, "num_layer": 2}}, r"unknown keys \['num_layer'\]"),
    ({"model": {"codebook_size": 25, "frames_per_token": 0}}, "frames_per_token must be a positive integer"),
    ({"model": {"codebook_size": 1}}, "codebook_size must be an integer >= 2"),
    ({"model": {"codebook_size": 25, "hidden_size": 30, "num_heads": 4}}, "whole, even head size"),
    ({"model": {"codebook_size": 25}, "heldout_fraction": 1.0}, "heldout_fraction must be in"),
    ({"model": {"codebook_size": 25}, "eval_itmes": 3}, "eval_itmes"),
])
def test_bad_reader_configs_fail_at_load_naming_the_field(toy, section, message):
    config = load_config_file(READER_CONFIG)
    config["token_reader"] = section
    with pytest.raises(InputError, match=message):
        get_stage("token_reader")(config, toy["lm"])


def test_bad_asr_reward_backend_settings(toy, tmp_path):
    config = load_config_file(ASR_CONFIG)
    for section, message in (({"tokenizer": "a", "reader": "b"}, "either tokenizer or reader, not both"),
                             ({"tokenizer": None}, "asr_reward.tokenizer is required .* or asr_reward.reader"),
                             ({"reader": "r", "tokenizer": None, "dpo_weight": 1.0, "heldout_fraction": 0.1},
                              "set heldout_fraction to 0")):
        with pytest.raises(InputError, match=message):
            get_stage("asr_reward")({**config, "asr_reward": {**config["asr_reward"], **section}}, toy["lm"])
    half = tmp_path / "half"
    half.mkdir()
    (half / "token_reader.json").write_bytes((toy["reader"] / "token_reader.json").read_bytes())
    with pytest.raises(InputError, match="half a token reader"):
        load_asr_backend(half)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "token_reader.safetensors").write_bytes((toy["reader"] / "token_reader.safetensors").read_bytes())
    doc = json.loads((toy["reader"] / "token_reader.json").read_text())
    doc["config"]["vocab_size"] += 1
    (bad / "token_reader.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="asr_vocab has .* classes, the config says"):
        load_asr_backend(bad)
