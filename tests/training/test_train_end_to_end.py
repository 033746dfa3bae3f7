"""Every CosyVoice 2 component trained from a raw corpus and served: the end-to-end check of the training stack.

On a tiny synthetic corpus (three synthetic "speakers" reading short English words; harmonic tones with a
speaker-specific pitch and formant envelope, one vowel-like sound per letter) the test runs, in one temporary
folder and a minute or so on one CPU core:

1. ``cadenza data prepare`` (JSONL layout) -> shards with mel, 24 kHz wav and f0;
2. the ``tokenizer`` and ``speaker`` stages through ``launcher.train``;
3. ``add_features`` with the stages' own extractor factories (``load_extractor``), filling ``speech_tokens`` and
   ``spk_emb`` from the trained tokenizer and speaker encoder;
4. the ``lm``, ``flow`` and ``hift`` stages on those shards (text ids tokenised on the fly by the LM stage);
5. ``assemble_model_dir`` -> one folder holding the trained networks, the trained speech tokenizer / speaker
   encoder (safetensors, no ONNX anywhere) and the text tokenizer the LM was trained with;
6. ``Cadenza.from_pretrained`` on it: plain text and zero-shot cloning from a corpus recording + its transcript.

Sizes are tied across stages the way a real run must tie them: the tokenizer's codebook is the LM/flow speech
vocabulary, the speaker encoder's embedding width is the flow's ``spk_embed_dim`` (both deliberately not the
release's 6561 / 192, so a hard-coded size anywhere on the way fails here).
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torch.nn.functional as F

from cadenza.data.dataset import ShardDataset
from cadenza.data.extractors import load_extractor
from cadenza.data.prepare import add_features, prepare
from cadenza.errors import InputError
from cadenza.layers.fsq_codes import fsq_codebook_size
from cadenza.models.cosyvoice2.loader import QWEN_DIR
from cadenza.training.config import load_config_file
from cadenza.training.launcher import train
from cadenza.training.metrics import read_metrics
from cadenza.training.model_files import resolve_model
from helpers import one_torch_thread

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs" / "train"

SR = 22050  # the corpus rate; preparation resamples to the model's 24 kHz
WORDS = ("hello", "world", "green", "apple", "seven", "river", "stone", "light", "music", "happy", "ocean", "quiet",
         "paper", "north", "table", "sunny")
# (f0 in Hz, formant scale) per synthetic speaker: pitch and vocal-tract length differ
SPEAKERS = {"anna": (220.0, 1.15), "bert": (110.0, 0.9), "cleo": (165.0, 1.0)}
UTTERANCES_PER_SPEAKER = 6
LETTER_SECONDS, GAP_SECONDS = 0.085, 0.06

# Sizes tied across the stages (not the release's, on purpose): codebook = (2K + 1)^D = LM / flow speech vocabulary;
# speaker embedding = flow spk_embed_dim. The Qwen text vocabulary must hold the test BPE (256 bytes + merges + 20
# special tokens).
FSQ_DIMS, FSQ_SCALE = 4, 1
SPEECH_VOCAB = fsq_codebook_size(FSQ_SCALE, FSQ_DIMS)
SPK_DIM = 48
TEXT_VOCAB = 300
STEPS = {"tokenizer": 40, "speaker": 30, "lm": 20, "flow": 20, "hift": 3}
# mean(last 3 losses) / mean(first 3) must be below this (measured: lm ~0.17, flow ~0.7)
FALL = {"lm": 0.8, "flow": 0.9}


# ------------------------------------------------------------------------------------------------ the corpus


def _letter_formants(ch: str) -> tuple[float, float]:
    """A vowel-like (F1, F2) per letter: the "phonemes" the tokenizer's ASR head can tell apart."""
    i = ord(ch) - ord("a")
    return 280.0 + 55.0 * (i % 9), 850.0 + 120.0 * ((7 * i) % 13)


def _speak(text: str, f0: float, scale: float, rng: np.random.Generator) -> np.ndarray:
    """Harmonics of a gliding f0 shaped by per-letter formants (scaled per speaker); silence between words."""
    letter, gap = int(LETTER_SECONDS * SR), int(GAP_SECONDS * SR)
    pieces_f1, pieces_f2, pieces_amp = [np.zeros(gap)], [np.zeros(gap)], [np.zeros(gap)]
    for ch in text:
        if ch == " ":
            pieces_f1.append(np.zeros(gap))
            pieces_f2.append(np.zeros(gap))
            pieces_amp.append(np.zeros(gap))
            continue
        f1, f2 = _letter_formants(ch)
        pieces_f1.append(np.full(letter, f1 * scale))
        pieces_f2.append(np.full(letter, f2 * scale))
        pieces_amp.append(np.hanning(letter) ** 0.3)
    pieces_f1.append(np.zeros(gap))
    pieces_f2.append(np.zeros(gap))
    pieces_amp.append(np.zeros(gap))
    f1, f2, amp = np.concatenate(pieces_f1), np.concatenate(pieces_f2), np.concatenate(pieces_amp)
    n = amp.size
    t = np.arange(n) / SR
    pitch = f0 * (1.0 + 0.06 * np.sin(2 * np.pi * rng.uniform(0.5, 1.5) * t + rng.uniform(0, 6)))
    phase = 2 * np.pi * np.cumsum(pitch) / SR
    wav = np.zeros(n)
    for h in range(1, 30):
        fh = h * pitch
        envelope = (np.exp(-(((fh - f1) / (0.15 * f1 + 1e-9)) ** 2))
                    + 0.7 * np.exp(-(((fh - f2) / (0.12 * f2 + 1e-9)) ** 2)) + 0.02)
        wav += envelope * np.sin(h * phase) * (fh < SR / 2)
    wav *= amp
    wav = 0.5 * wav / np.abs(wav).max() + 0.003 * rng.standard_normal(n)
    return wav.astype(np.float32)


def _write_corpus(root: Path) -> Path:
    """``root/corpus/manifest.jsonl`` (JSONL layout) + wavs; returns the manifest."""
    corpus = root / "corpus"
    (corpus / "wavs").mkdir(parents=True)
    rng = np.random.default_rng(7)
    rows = []
    for name, (f0, scale) in SPEAKERS.items():
        for u in range(UTTERANCES_PER_SPEAKER):
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(2, 4)), replace=False))
            rel = f"wavs/{name}_{u}.wav"
            sf.write(corpus / rel, _speak(text, f0, scale, rng), SR)
            rows.append({"id": f"{name}_{u}", "audio": rel, "text": text, "speaker": name, "language": "en"})
    manifest = corpus / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return manifest


# ------------------------------------------------------------------------------------------------ configs


def _config(stage: str, model: dict | None = None) -> dict:
    """The stage's tiny config with the shared sizes, a few steps, logging every step, no mid-run checkpoints."""
    config = load_config_file(CONFIGS / f"{stage}_tiny.yaml")
    config["train"].update(max_steps=STEPS[stage], log_every=1, ckpt_every=STEPS[stage], progress=False,
                           tensorboard=False)
    if stage == "tokenizer":
        config["tokenizer"]["model"].update(fsq_dims=FSQ_DIMS, fsq_scale=FSQ_SCALE)
        config["tokenizer"]["eval_every"] = 0
        config["train"]["batch_size"] = 8
    if stage == "speaker":
        config["speaker"]["model"]["embedding_size"] = SPK_DIM
        config["speaker"].update(eval_every=0, margin_warmup_steps=0)
        config["train"]["batch_size"] = 6
    if model is not None:
        config["model"] = copy.deepcopy(model)
    return config


def _model_section(tokenizer_dir: Path) -> dict:
    """The lm/flow/hift ``model:`` section: the tiny LM config with the tied sizes and the test text tokenizer."""
    model = copy.deepcopy(load_config_file(CONFIGS / "lm_tiny.yaml")["model"])
    model["qwen"]["vocab_size"] = TEXT_VOCAB
    overrides = model["overrides"]
    overrides["spk_embed_dim"] = SPK_DIM
    overrides["llm"]["speech_token_size"] = SPEECH_VOCAB
    overrides["flow"].update(vocab_size=SPEECH_VOCAB, spk_embed_dim=SPK_DIM)
    model["tokenizer"] = str(tokenizer_dir)
    return model


def _run(stage: str, config: dict, data: Path, out: Path, resume: bool = False) -> Path:
    with one_torch_thread():
        return train(stage, CONFIGS / f"{stage}_tiny.yaml", data, out, resume=resume, config_overrides=config)


# ------------------------------------------------------------------------------------------------ the pipeline


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> dict:
    from toy_model import _tokenizer_files

    root = tmp_path_factory.mktemp("e2e")
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    manifest = _write_corpus(root)
    lap("corpus")
    data = root / "data"
    with one_torch_thread():
        summary = prepare(manifest, "jsonl", data, shard_size=8, progress=False)
    lap("prepare")

    runs = {s: root / "runs" / s for s in STEPS}
    _run("tokenizer", _config("tokenizer"), data, runs["tokenizer"])
    lap("tokenizer")
    _run("speaker", _config("speaker"), data, runs["speaker"])
    lap("speaker")

    with one_torch_thread():
        tokens = add_features(data, load_extractor(
            f"cadenza.training.speech_tokenizer_stage:speech_token_extractor={runs['tokenizer']}"), progress=False)
        embeddings = add_features(data, load_extractor(
            f"cadenza.training.speaker_encoder_stage:speaker_embedding_extractor={runs['speaker']}"), progress=False)
    lap("extract")

    text_tok = root / "text_tokenizer"
    text_tok.mkdir()
    _tokenizer_files(text_tok, TEXT_VOCAB - 20)  # + 20 special tokens = the Qwen vocabulary
    model = _model_section(text_tok)
    for stage in ("lm", "flow", "hift"):
        _run(stage, _config(stage, model), data, runs[stage])
        lap(stage)

    from cadenza.training.export import assemble_model_dir

    folder = assemble_model_dir(runs["lm"], runs["flow"], runs["hift"], runs["tokenizer"], runs["speaker"],
                                out=root / "model")
    lap("assemble")
    return {"root": root, "manifest": manifest, "data": data, "summary": summary, "runs": runs, "folder": folder,
            "extract": {"tokens": tokens, "embeddings": embeddings}, "timings": timings, "text_tokenizer": text_tok,
            "model_config": resolve_model(model).config, "model_section": model}


def _shard_items(pipeline: dict) -> list[dict]:
    ds = ShardDataset(pipeline["data"], ("speech_tokens", "spk_emb", "mel"))
    return [ds[i] for i in range(len(ds))]


def test_data_preparation_and_extraction(pipeline):
    summary = pipeline["summary"]
    n = len(SPEAKERS) * UTTERANCES_PER_SPEAKER
    assert summary["complete"] and summary["accepted"] == n and summary["rejected"] == 0
    assert pipeline["extract"]["tokens"]["failed"] == 0 and pipeline["extract"]["embeddings"]["failed"] == 0
    items = _shard_items(pipeline)
    assert len(items) == n
    for item in items:
        assert 1.0 <= item["seconds"] <= 3.0
        tok = item["speech_tokens"]
        assert tok.dtype == torch.int32 and 0 <= int(tok.min()) and int(tok.max()) < SPEECH_VOCAB
        # 25 Hz tokens vs 50 Hz mel frames: the tokenizer saw the same audio as the mel extractor
        assert abs(2 * tok.numel() - item["mel"].shape[0]) <= 4
        assert item["spk_emb"].shape == (SPK_DIM,) and torch.isfinite(item["spk_emb"]).all()
    # the trained speaker encoder already tells the three voices apart
    emb = F.normalize(torch.stack([it["spk_emb"] for it in items]), dim=-1)
    speakers = [it["speaker"] for it in items]
    same = torch.tensor([[a == b for b in speakers] for a in speakers])
    scores, off_diagonal = emb @ emb.T, ~torch.eye(n, dtype=torch.bool)
    assert scores[same & off_diagonal].mean() > scores[~same].mean() + 0.1


@pytest.mark.parametrize("stage", list(STEPS))
def test_every_stage_logged_its_steps(pipeline, stage):
    metrics = read_metrics(pipeline["runs"][stage])
    assert [m["step"] for m in metrics] == list(range(1, STEPS[stage] + 1))
    assert all(math.isfinite(m["loss"]) for m in metrics)


@pytest.mark.parametrize("stage", list(FALL))
def test_lm_and_flow_losses_fall(pipeline, stage):
    losses = np.array([m["loss"] for m in read_metrics(pipeline["runs"][stage])])
    first, last = losses[:3].mean(), losses[-3:].mean()
    assert last < FALL[stage] * first, f"{stage}: loss {first:.3f} -> {last:.3f}"


def test_assembled_folder_holds_every_trained_part(pipeline):
    folder, runs = pipeline["folder"], pipeline["runs"]
    for name, stage in (("llm.pt", "lm"), ("flow.pt", "flow"), ("hift.pt", "hift"),
                        ("speech_tokenizer.safetensors", "tokenizer"), ("speech_tokenizer.json", "tokenizer"),
                        ("speaker_encoder.safetensors", "speaker"), ("speaker_encoder.json", "speaker")):
        assert (folder / name).read_bytes() == (runs[stage] / name).read_bytes(), name
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        assert (folder / QWEN_DIR / name).read_bytes() == (pipeline["text_tokenizer"] / name).read_bytes(), name
    assert not list(folder.glob("*.onnx"))  # the frontend can only use what was trained here


@pytest.mark.parametrize("part", ["tokenizer", "speaker"])
def test_assembly_refuses_a_frontend_model_of_other_sizes(pipeline, part, tmp_path):
    """A tokenizer with another codebook / a speaker encoder with another width than the LM and flow were trained
    on is an error at assembly, not garbage at synthesis."""
    from cadenza.training.export import assemble_model_dir

    name, key, value, message = {
        "tokenizer": ("speech_tokenizer", "fsq_dims", FSQ_DIMS + 1, "speech vocabulary"),
        "speaker": ("speaker_encoder", "embedding_size", SPK_DIM + 1, "spk_embed_dim"),
    }[part]
    other = tmp_path / part
    other.mkdir()
    shutil.copyfile(pipeline["runs"][part] / f"{name}.safetensors", other / f"{name}.safetensors")
    doc = json.loads((pipeline["runs"][part] / f"{name}.json").read_text())
    doc["config"][key] = value
    (other / f"{name}.json").write_text(json.dumps(doc))
    runs = pipeline["runs"]
    with pytest.raises(InputError, match=message):
        assemble_model_dir(runs["lm"], runs["flow"], runs["hift"], other, out=tmp_path / "model", verify=False)


def test_the_trained_model_synthesizes(pipeline):
    """Plain text, then zero-shot cloning: the prompt goes through the trained tokenizer and speaker encoder in the
    normal frontend, which must compute exactly the features the LM and flow were trained on."""
    from cadenza import Cadenza

    manifest = pipeline["manifest"]
    item = next(it for it in _shard_items(pipeline) if it["speaker"] == "bert")
    prompt_wav = str(manifest.parent / "wavs" / f"{item['id']}.wav")
    t0 = time.perf_counter()
    with one_torch_thread(), Cadenza.from_pretrained(pipeline["folder"]) as tts:
        assert tts.sample_rate == pipeline["model_config"].sample_rate
        plain = tts.synthesize("hello green river", seed=3)
        request = tts.request("seven quiet stones", prompt_wav=prompt_wav, prompt_text=item["text"], seed=4)
        assert request.mode == "zero_shot"
        for ids in (request.lm_prompt_speech, request.voice.flow_prompt_speech):
            assert ids.numel() > 0 and 0 <= int(ids.min()) and int(ids.max()) < SPEECH_VOCAB
        prompt_tokens = request.voice.flow_prompt_speech[0]
        stored = item["speech_tokens"][: prompt_tokens.numel()].long()
        assert (prompt_tokens == stored).float().mean() >= 0.9  # int16 storage may flip a borderline token
        embedding = request.voice.embedding
        assert embedding.shape == (1, SPK_DIM)
        assert F.cosine_similarity(embedding[0], item["spk_emb"], dim=0) > 0.99
        cloned = tts.synthesize("seven quiet stones", prompt_wav=prompt_wav, prompt_text=item["text"], seed=4)
    pipeline["timings"]["synthesize"] = time.perf_counter() - t0
    for audio in (plain, cloned):
        samples = np.asarray(audio.samples)
        assert audio.sample_rate == tts.sample_rate and audio.duration > 0
        assert np.isfinite(samples).all() and np.abs(samples).max() <= 1.0
    print("end-to-end timings (s):", {k: round(v, 1) for k, v in pipeline["timings"].items()})


def test_lm_holds_items_out_and_reports_their_loss(pipeline, tmp_path):
    """``lm.heldout_fraction`` keeps items out of training; ``eval_every`` logs their teacher-forced loss, which
    starts at chance (a fresh LM is near-uniform over the speech ids) and moves as the LM trains."""
    from cadenza.training.lm_stage import LMStage

    config = _config("lm", pipeline["model_section"])
    config["lm"].update(heldout_fraction=0.25, split_seed=3, eval_every=2)
    config["train"].update(max_steps=4, ckpt_every=4)
    n_items = len(SPEAKERS) * UTTERANCES_PER_SPEAKER

    stage = LMStage(config, pipeline["data"])
    train_set = stage.dataset()
    held_out = set(stage.heldout_idx)
    assert 0 < len(held_out) < n_items and len(train_set) == n_items - len(held_out)
    assert not held_out & {train_set[i]["index"] for i in range(len(train_set))}
    with one_torch_thread():
        torch.manual_seed(0)  # the fresh LM's initialisation
        stage.setup(torch.device("cpu"), lambda m: m)
        fresh = stage.evaluate()
    chance = math.log(stage.lm.llm_decoder.out_features)  # a near-uniform LM's cross-entropy
    assert abs(fresh["heldout_ce"] - chance) < 1.0 and fresh["heldout_items"] == len(held_out)

    _run("lm", config, pipeline["data"], tmp_path / "lm")
    metrics = read_metrics(tmp_path / "lm")
    evaluated = [m for m in metrics if "heldout_ce" in m]
    assert [m["step"] for m in evaluated] == [2, 4]
    assert all(math.isfinite(m["heldout_ce"]) and 0 <= m["heldout_acc"] <= 1 for m in evaluated)
    assert evaluated[-1]["heldout_ce"] != pytest.approx(fresh["heldout_ce"], abs=1e-3)  # it measures the trained LM


def test_lm_exports_its_best_heldout_evaluation(pipeline, tmp_path):
    """``lm.export_best``: ``llm.pt`` holds the weights of the evaluation with the lowest ``heldout_ce`` (loading
    them gives that loss again), the last step's go to ``llm_last.pt``; a resumed run keeps the best so far."""
    from cadenza.training.lm_stage import TIED_LM_HEAD_KEY, LMStage

    config = _config("lm", pipeline["model_section"])
    config["lm"].update(heldout_fraction=0.25, split_seed=3, eval_every=1, export_best=True)
    config["train"].update(max_steps=3, ckpt_every=3)
    out = tmp_path / "lm"
    _run("lm", config, pipeline["data"], out)
    config["train"].update(max_steps=6)
    _run("lm", config, pipeline["data"], out, resume=True)
    evaluated = {m["step"]: m["heldout_ce"] for m in read_metrics(out) if "heldout_ce" in m}
    assert sorted(evaluated) == [1, 2, 3, 4, 5, 6]
    best = json.loads((out / "best.json").read_text())
    assert best["step"] == min(evaluated, key=evaluated.get)
    assert best["heldout_ce"] == pytest.approx(evaluated[best["step"]], abs=1e-6)
    assert (out / "llm_last.pt").is_file()

    reloaded = dict(config, lm={**config["lm"], "init_llm": str(out / "llm.pt")})
    stage = LMStage(reloaded, pipeline["data"])
    stage.dataset()
    with one_torch_thread():
        stage.setup(torch.device("cpu"), lambda m: m)
        again = stage.evaluate()
    assert again["heldout_ce"] == pytest.approx(best["heldout_ce"], abs=1e-4)
    last = torch.load(out / "llm_last.pt", weights_only=True)
    chosen = torch.load(out / "llm.pt", weights_only=True)
    assert (best["step"] == 6) == all(torch.equal(last[k], chosen[k]) for k in last)
    assert list(chosen) == list(last)  # the release's key order, tied head included
    # The head is stored once, as in the release: the same storage as the embedding, in both files.
    for state in (chosen, last):
        assert state[TIED_LM_HEAD_KEY].data_ptr() == state["llm.model.model.embed_tokens.weight"].data_ptr()

    # The best is a copy: training on after it (weights changed in place) leaves it as it was.
    before = {k: v.clone() for k, v in stage.lm.state_dict().items()}
    stage._track_best(7, {"heldout_ce": 1.0})
    with torch.no_grad():
        for p in stage.lm.parameters():
            p.add_(1.0)
    stage._track_best(8, {"heldout_ce": 2.0})  # worse: not taken
    assert stage.best["step"] == 7
    assert all(torch.equal(stage.best["state"][k], before[k]) for k in before)


def test_flow_data_of_another_tokenizer_is_refused_and_leaves_no_folder(pipeline, tmp_path):
    """Speech tokens past the flow's vocabulary (data prepared with another tokenizer) were an "unexpected
    IndexError (a bug)", a device-side assert on a GPU, and left an empty --out behind."""
    from cadenza.errors import InputError

    model = copy.deepcopy(pipeline["model_section"])
    model["overrides"]["flow"]["vocab_size"] = model["overrides"]["llm"]["speech_token_size"] = 2  # the data: more
    out = tmp_path / "flow"
    with pytest.raises(InputError, match=r"speech token id \d+ outside \[0, 2\): the data does not fit the model"):
        _run("flow", _config("flow", model), pipeline["data"], out)
    assert not out.exists()
