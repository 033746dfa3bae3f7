"""The differentiable ASR reward (L_ASR) and the ``asr_reward`` stage: the Gumbel path, the FSQ code inverse against
the tokenizer's own id embedding, gradients that reach the LM only (the tokenizer stays bit-for-bit frozen), a toy
run that lowers the reward loss (alone and with DPO), resume, and the refusals for tokenizers without an ASR head."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza.data.shards import write_prepared
from cadenza.errors import InputError
from cadenza.models.speech_tokenizer import CharVocab, SpeechTokenizerConfig, SupervisedSpeechTokenizer
from cadenza.models.speech_tokenizer.inference import save_speech_tokenizer
from cadenza.training.asr_reward import asr_nll, gumbel_softmax_st, load_asr_backend, speech_positions
from cadenza.training.checkpoint import save_checkpoint
from cadenza.training.config import load_config_file
from cadenza.training.dpo_pairs import write_pairs
from cadenza.training.launcher import train
from cadenza.training.metrics import read_metrics
from cadenza.training.registry import get_stage

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "train" / "asr_reward_tiny.yaml"
WORDS = ["a cab", "bad ace", "dab", "bead", "cede a bed", "add a cab", "be", "deed"]
TEXT_VOCAB = 100


def _tokenizer_cfg(vocab: CharVocab, **over) -> SpeechTokenizerConfig:
    sizes = dict(n_mels=8, hidden_size=16, num_heads=2, ffn_size=32, encoder1_layers=1, encoder2_layers=1,
                 fsq_dims=2, fsq_scale=2, vocab_size=len(vocab))  # 5^2 = 25 token ids
    return SpeechTokenizerConfig(**{**sizes, **over})


def _teach_asr_half(model: SupervisedSpeechTokenizer, vocab: CharVocab, steps: int = 150) -> None:
    """Train the ASR half (up-projection, Encoder2, CTC head) to read ``_records``' token sequences as their text,
    as the tokenizer stage's CTC loss does from audio: L_ASR then has something to reward."""
    from cadenza.training.asr_reward import TokenASRBackend

    torch.set_num_threads(1)  # tiny sizes: threads only contend on a shared CPU
    backend = TokenASRBackend(model.cfg)
    recs = _records(64, 5)
    ids = torch.nn.utils.rnn.pad_sequence([a["speech_tokens"].long() for _, a in recs], batch_first=True)
    lengths = torch.tensor([len(a["speech_tokens"]) for _, a in recs])
    mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
    labels = [torch.tensor(vocab.encode(e["text"])) for e, _ in recs]
    opt = torch.optim.Adam(backend.parameters(), lr=1e-2)
    for _ in range(steps):
        log_probs = backend(torch.nn.functional.one_hot(ids, 25).float(), mask)
        loss = torch.nn.functional.ctc_loss(log_probs.transpose(0, 1), torch.cat(labels), lengths,
                                            torch.tensor([len(x) for x in labels]), reduction="mean")
        opt.zero_grad()
        loss.backward()
        opt.step()
    state = backend.state_dict()
    with torch.no_grad():
        model.tokenizer.quantizer.out_proj.load_state_dict({k[9:]: v for k, v in state.items() if k.startswith("out_proj.")})
        model.encoder2.load_state_dict({k[8:]: v for k, v in state.items() if k.startswith("encoder.")})
        model.asr_head.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("head.")})


def write_tokenizer_run(folder: Path, seed: int = 0, teach: bool = False, **over) -> SupervisedSpeechTokenizer:
    """A tokenizer run folder as ``cadenza train tokenizer --out`` leaves it: the export (json with the vocabulary
    in its metadata + the inference weights) and a checkpoint whose state holds the whole supervised model."""
    vocab = CharVocab.from_texts(WORDS)
    torch.manual_seed(seed)
    model = SupervisedSpeechTokenizer(_tokenizer_cfg(vocab, **over))
    if teach:
        _teach_asr_half(model, vocab)
    save_speech_tokenizer(model.tokenizer, folder, {"asr_vocab": vocab.to_dict()})
    save_checkpoint(folder, 5, {"stage": "tokenizer", "world_size": 1, "train": {},
                                "state": {"model": {k: v.clone() for k, v in model.state_dict().items()},
                                          "optim": {}, "vocab": vocab.to_dict()}, "rng": []})
    return model


def _records(n: int, seed: int) -> list[tuple[dict, dict]]:
    """Text ids and speech tokens that are functions of the transcript's characters (2 tokens per character)."""
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        text = rng.choice(WORDS)
        text_ids = [3 + ord(c) % 90 for c in text]
        speech = [(ord(c) * k) % 25 for c in text for k in (1, 7)]
        recs.append(({"id": f"u{i:03d}", "text": text},
                     {"text_ids": torch.tensor(text_ids, dtype=torch.int32),
                      "speech_tokens": torch.tensor(speech, dtype=torch.int32)}))
    return recs


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("asr_reward")
    write_tokenizer_run(root / "tokenizer", teach=True)
    write_prepared(root / "lm", _records(24, 0), shard_size=12)
    rng = random.Random(1)
    pairs = []
    for entry, arrays in _records(24, 2):
        chosen = arrays["speech_tokens"].tolist()
        pairs.append({"id": entry["id"], "text": entry["text"], "text_ids": arrays["text_ids"].tolist(),
                      "chosen": chosen, "rejected": [rng.randrange(25) for _ in chosen]})
    (root / "pairs").mkdir()
    write_pairs(root / "pairs" / "preference_pairs.jsonl", pairs)
    return {"root": root, "tokenizer": root / "tokenizer", "lm": root / "lm", "pairs": root / "pairs"}


def _overrides(tokenizer: Path, **section) -> dict:
    config = load_config_file(CONFIG)
    return {"asr_reward": {**config["asr_reward"], "tokenizer": str(tokenizer), **section}}


def _stage(setup, **section):
    config = load_config_file(CONFIG)
    config.update(_overrides(setup["tokenizer"], **section))
    stage = get_stage("asr_reward")(config, setup["pairs"] if section.get("dpo_weight") else setup["lm"])
    torch.manual_seed(config["train"]["seed"])  # as the launcher: the LM a run starts from
    stage.setup(torch.device("cpu"), lambda m: m)
    return stage


# -- the Gumbel path and the FSQ code inverse -------------------------------------------------------------------

def test_straight_through_forward_is_the_sampled_one_hot_and_its_gradient_the_relaxed_one():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 25, generator=g, requires_grad=True)
    noise = -torch.log(-torch.log(torch.rand(6, 25, generator=g)))
    hard = gumbel_softmax_st(logits, 0.7, noise=noise)
    assert torch.equal(hard.detach(), torch.nn.functional.one_hot((logits + noise).argmax(-1), 25).float())
    weights = torch.randn(6, 25, generator=g)
    (hard * weights).sum().backward()
    grad_st = logits.grad.clone()
    logits.grad = None
    soft = gumbel_softmax_st(logits, 0.7, noise=noise, straight_through=False)
    (soft * weights).sum().backward()
    assert torch.allclose(grad_st, logits.grad) and grad_st.abs().sum() > 0
    # Gumbel-max: the hard tokens are samples of softmax(logits) (frequency of each id over many draws)
    many = gumbel_softmax_st(logits.detach()[:1].expand(20000, -1), 1.0, generator=g).detach()
    freq = many.mean(0)
    assert torch.allclose(freq, torch.softmax(logits.detach()[0], -1), atol=0.015)
    with pytest.raises(InputError, match="temperature"):
        gumbel_softmax_st(logits, 0.0)


def test_gumbel_path_equals_the_hard_token_path_as_temperature_goes_to_zero(setup):
    """backend(Gumbel-softmax sample) -> the tokenizer's own path on the sampled ids (embed_ids -> Encoder2 -> CTC
    head) as tau -> 0; the straight-through forward equals it at any tau."""
    model = write_tokenizer_run(setup["root"] / "tok_equal", seed=3).eval()
    backend = load_asr_backend(setup["root"] / "tok_equal").model
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 9, 25, generator=g) * 2
    noise = -torch.log(-torch.log(torch.rand(2, 9, 25, generator=g)))
    ids = (logits + noise).argmax(-1)
    mask = torch.ones(2, 9, dtype=torch.bool)
    with torch.no_grad():
        x = model.encoder2(model.tokenizer.embed_ids(ids), mask)
        hard_path = torch.log_softmax(model.asr_head(x).float(), -1)
        errors = []
        for tau in (1.0, 0.1, 0.01, 0.001):
            soft = gumbel_softmax_st(logits, tau, noise=noise, straight_through=False)
            errors.append(float((backend(soft, mask) - hard_path).abs().max()))
        st = backend(gumbel_softmax_st(logits, 1.0, noise=noise), mask)
    assert errors[-1] < 1e-4 and errors[0] > 100 * errors[-1], errors
    assert errors == sorted(errors, reverse=True)
    assert torch.allclose(st, hard_path, atol=1e-5)


def test_speech_positions_follow_each_sequence_in_order():
    targets = torch.tensor([5, 7, 27, 3, 1, 2, 25, 26])  # speech vocab 25: 25 / 26 / 27 are eos, fill, ...
    rows = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])
    which, slot, lengths = speech_positions(targets, rows, 3, 25)
    assert which.tolist() == [0, 1, 3, 4, 5] and lengths.tolist() == [2, 3, 0]
    assert slot.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]]


# -- gradients and freezing --------------------------------------------------------------------------------------

def test_l_asr_gradient_reaches_the_lm_and_the_tokenizer_stays_frozen_bit_for_bit(setup):
    stage = _stage(setup)
    backend = stage.backend.model
    before = {k: v.clone() for k, v in backend.state_dict().items()}
    assert all(not p.requires_grad for p in backend.parameters()) and not backend.training
    items = [stage.dataset()[i] for i in range(4)]
    seqs = [stage.sequence(it, it["text_ids"], it["speech_tokens"], 1.0) for it in items]
    from cadenza.training.lm_model import targets_of

    b = stage.to_batch(seqs)
    select, targets, rows = targets_of(b)
    logits = stage.model(b.kinds, b.ids, select)
    labels = [stage.labels(it["text"], it["id"]) for it in items]
    loss, feasible, _ = stage.asr_loss(logits, targets, rows, 4, labels)
    assert feasible.all() and loss > 0
    loss.backward()
    grads = {n: p.grad for n, p in stage.lm.named_parameters()}
    assert grads["llm_decoder.weight"] is not None and grads["llm_decoder.weight"].abs().sum() > 0
    body = [g for n, g in grads.items() if ".layers." in n and g is not None]
    assert body and all(torch.isfinite(g).all() for g in body) and sum(float(g.abs().sum()) for g in body) > 0
    assert all(p.grad is None for p in backend.parameters())
    stage.lm.zero_grad()
    for step in range(3):  # optimiser steps through train_step: the backend never moves
        stage.train_step([stage.dataset()[i] for i in range(4)], step)
    after = backend.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# -- training runs through the launcher -------------------------------------------------------------------------

STEPS = 60


def _run_overrides(tokenizer: Path, **section) -> dict:
    config = load_config_file(CONFIG)
    train_cfg = {**config["train"], "max_steps": STEPS, "optim": {**config["train"]["optim"], "lr": 1.0e-2}}
    return {"train": train_cfg, **_overrides(tokenizer, **section)}


@pytest.fixture(scope="module")
def runs(setup) -> dict[str, Path]:
    torch.set_num_threads(1)
    out = {}
    # L_DPO at 0.1: at weight 1 it dominates this toy (random LM and reference, random rejected tokens): it pushes
    # the rejected tokens down faster than L_ASR pulls the readable ones up, and L_ASR rises (docs/training.md)
    for name, data, section in (("alone", "lm", {}), ("both", "pairs", {"dpo_weight": 0.1})):
        out[name] = setup["root"] / f"run_{name}"
        train("asr_reward", CONFIG, setup[data], out[name], config_overrides=_run_overrides(setup["tokenizer"], **section))
    return out


def _mean_asr(setup, init_llm: Path | None) -> float:
    """L_ASR of every corpus item under the LM (the run's starting LM, or an exported one), averaged over 8 Gumbel
    draws with fixed noise: a steadier measure than the per-batch training figures."""
    from cadenza.training.lm_model import targets_of

    stage = _stage(setup, **({"init_llm": str(init_llm)} if init_llm else {}))
    items = [stage.dataset()[i] for i in range(len(stage.dataset()))]
    torch.manual_seed(0)
    with torch.no_grad():
        b = stage.to_batch([stage.sequence(it, it["text_ids"], it["speech_tokens"], 1.0) for it in items])
        select, targets, rows = targets_of(b)
        logits = stage.model(b.kinds, b.ids, select)
        labels = [stage.labels(it["text"], it["id"]) for it in items]
        return float(np.mean([float(stage.asr_loss(logits, targets, rows, len(items), labels)[0]) for _ in range(8)]))


@pytest.mark.parametrize("mode", ["alone", "both"])
def test_toy_run_lowers_the_reward_loss(setup, runs, mode):
    metrics = read_metrics(runs[mode])
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(np.isfinite(m["asr_loss"]) and m["asr_feasible"] == 1.0 for m in metrics)
    before, after = _mean_asr(setup, None), _mean_asr(setup, runs[mode] / "llm.pt")
    fall = {"alone": 0.85, "both": 0.92}[mode]  # measured: 7.34 -> 5.55 alone, -> 6.51 with L_DPO
    assert before > 6.5 and after < fall * before, (before, after)  # ~7.3 nats per character at the start
    assert (runs[mode] / "cosyvoice2.yaml").is_file()
    if mode == "both":  # DPO starts at ln 2 (policy == reference) and learns the preference beside L_ASR
        assert metrics[0]["dpo_loss"] == pytest.approx(np.log(2), abs=1e-5)
        dpo = np.array([m["dpo_loss"] for m in metrics])
        assert dpo[-10:].mean() < dpo[:5].mean() - 0.05, dpo
    else:
        assert "dpo_loss" not in metrics[0]


def test_resume_continues_the_same_curve(setup, runs, tmp_path):
    torch.set_num_threads(1)  # as the full run: the same kernels, bit for bit
    out = tmp_path / "resumed"
    over = _run_overrides(setup["tokenizer"], dpo_weight=0.1)
    train("asr_reward", CONFIG, setup["pairs"], out, max_steps=40, config_overrides=over)
    train("asr_reward", CONFIG, setup["pairs"], out, resume=True, config_overrides=over)
    full = read_metrics(runs["both"])
    resumed = read_metrics(out)
    assert [m["step"] for m in resumed] == list(range(1, STEPS + 1))
    for a, b in zip(full[40:], resumed[40:]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)


# -- refusals ---------------------------------------------------------------------------------------------------

def test_refuses_the_released_s3_tokenizer(tmp_path):
    model = tmp_path / "CosyVoice2-0.5B"
    model.mkdir()
    (model / "speech_tokenizer_v2.onnx").write_bytes(b"onnx")
    for path in (model, model / "speech_tokenizer_v2.onnx"):
        with pytest.raises(InputError, match="S3 tokenizer.*no ASR head.*cadenza train tokenizer"):
            load_asr_backend(path)


def test_refuses_tokenizers_without_an_asr_head(setup, tmp_path):
    exported = tmp_path / "exported"
    exported.mkdir()
    for name in ("speech_tokenizer.json", "speech_tokenizer.safetensors"):
        (exported / name).write_bytes((setup["tokenizer"] / name).read_bytes())
    with pytest.raises(InputError, match="exported tokenizer only.*checkpoints"):
        load_asr_backend(exported)
    builtin = REPO / "src" / "cadenza" / "assets" / "cadenza-tiny"
    with pytest.raises(InputError, match="frame-classifier tokenizer.*no ASR head.*train a token reader: cadenza train "
                                         "token_reader"):
        load_asr_backend(builtin)
    headless = tmp_path / "headless"
    headless.mkdir()
    doc = json.loads((setup["tokenizer"] / "speech_tokenizer.json").read_text())
    doc["config"]["vocab_size"] = 0
    doc["metadata"] = {}
    (headless / "speech_tokenizer.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="no ASR head"):
        load_asr_backend(headless)
    with pytest.raises(InputError, match="not found"):
        load_asr_backend(tmp_path / "nowhere")


def test_refuses_a_tokenizer_of_another_codebook_and_pairs_without_text(setup, tmp_path):
    write_tokenizer_run(tmp_path / "tok81", fsq_dims=4, fsq_scale=1)  # 81 ids, the LM speaks 25
    with pytest.raises(InputError, match="81 token ids but the LM speaks 25"):
        _stage({**setup, "tokenizer": tmp_path / "tok81"})
    with pytest.raises(InputError, match="asr_reward.tokenizer is required"):
        get_stage("asr_reward")({**load_config_file(CONFIG), "asr_reward": {}}, setup["lm"])
    data = tmp_path / "pairs"
    data.mkdir()
    write_pairs(data / "preference_pairs.jsonl", [{"id": "x", "text_ids": [3, 4], "chosen": [1, 2],
                                                   "rejected": [2, 1]}])
    stage = _stage({**setup, "pairs": data}, dpo_weight=1.0)
    with pytest.raises(InputError, match="needs each pair's text"):
        stage.dataset()


def test_asr_nll_counts_an_impossible_alignment_as_zero_and_infeasible(setup):
    backend = load_asr_backend(setup["tokenizer"]).model
    logits = torch.randn(5, 25)
    slot = torch.tensor([[0, 0], [0, 1], [0, 2], [1, 0], [1, 1]])
    nll, feasible = asr_nll(backend, logits, slot, torch.tensor([3, 2]), [[2, 3], [2, 3, 4, 5]], 1.0)
    assert feasible.tolist() == [True, False] and nll[1] == 0 and nll[0] > 0


def test_two_ddp_processes_match_one_process_with_the_doubled_batch(setup, tmp_path):
    """torchrun --nproc_per_node 2 (gloo on the CPU), batch 2 per process == one process with batch 4, for L_ASR +
    L_DPO: the Gumbel draws come per item, the losses are means over the global batch."""
    import os
    import subprocess
    import sys

    import yaml

    steps = 4
    config = load_config_file(CONFIG)
    config.update(_overrides(setup["tokenizer"], dpo_weight=1.0))
    config["train"].update(batch_size=2, max_steps=steps, ckpt_every=steps)
    (tmp_path / "ddp.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "cadenza.cli.train", "asr_reward", "--config", str(tmp_path / "ddp.yaml"),
         "--data", str(setup["pairs"]), "--out", str(tmp_path / "ddp")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch.set_num_threads(1)
    single_train = {**config["train"], "batch_size": 4}
    train("asr_reward", tmp_path / "ddp.yaml", setup["pairs"], tmp_path / "single",
          config_overrides={"train": single_train})
    ddp, single = read_metrics(tmp_path / "ddp"), read_metrics(tmp_path / "single")
    assert len(ddp) == len(single) == steps
    for a, b in zip(ddp, single):
        for key in ("loss", "asr_loss", "dpo_loss"):
            assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(b[key])), (key, a, b)
