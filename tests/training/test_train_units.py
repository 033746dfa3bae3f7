"""Pieces of the training code, checked against the spec and the inference modules: LM sequence layouts, the
training forward vs the inference teacher-forcing path, per-row attention masks, flow padding invariance, the
per-sequence log-prob of DPO, release key names of the exports, config round trips, schedules, samplers, pairs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from cadenza.errors import CheckpointError, InputError
from cadenza.layers.masks import attention_mask, padding_mask
from cadenza.layers.per_sample_masks import per_sample_attention_mask
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.models.cosyvoice2.lm import TIED_LM_HEAD_KEY, TextSpeechLM
from cadenza.training.checkpoint import atomic_torch_save, load_checkpoint
from cadenza.training.config import OptimConfig, TrainConfig
from cadenza.training.dpo_pairs import make_pairs, read_pairs, write_pairs
from cadenza.training.flow_objective import FlowForTraining
from cadenza.training.init_weights import QWEN_BODY_PREFIX, load_component, load_qwen_body
from cadenza.training.lm_layout import (
    IGNORE_ID,
    SOS,
    SPEECH,
    TASK_ID,
    TEXT,
    bistream,
    build_sequence,
    can_bistream,
    pad_sequences,
    unistream,
)
from cadenza.training.lm_model import LMForTraining, sequence_log_probs, targets_of
from cadenza.training.lm_stage import tied_llm_state
from cadenza.training.model_files import check_writable, cosyvoice2_yaml, resolve_model
from cadenza.training.optim import Optimization, lr_factor
from cadenza.training.registry import get_stage
from cadenza.training.sampler import ResumableDistributedSampler
from cadenza.training.seeding import item_generator, rng_state, set_rng_state

from small_model import small_training_model

TINY = small_training_model()


@pytest.fixture(scope="module")
def tiny():
    return resolve_model(TINY).config


# ---- LM layouts (docs/training.md, "Stage lm") ------------------------------------------------------------------------------------
def test_unistream_layout():
    seq = unistream([7, 8], [1, 2, 3], eos_id=50)
    assert seq.kinds == [SOS, TEXT, TEXT, TASK_ID, SPEECH, SPEECH, SPEECH]
    assert seq.ids == [0, 7, 8, 0, 1, 2, 3]
    assert seq.targets == [IGNORE_ID] * 3 + [1, 2, 3, 50]


@pytest.mark.parametrize("n_text", [7, 10, 3])
def test_bistream_layout_follows_the_spec(n_text):
    n, m, eos, fill = 5, 15, 50, 52
    text, speech = list(range(100, 100 + n_text)), list(range(3 * n_text + 4))
    seq = bistream(text, speech, (n, m), eos, fill)
    kinds, ids, targets = [SOS], [0], [IGNORE_ID]
    full = n_text // n
    for j in range(full):
        kinds += [TEXT] * n + [SPEECH] * m
        ids += text[j * n : (j + 1) * n] + speech[j * m : (j + 1) * m]
        targets += [IGNORE_ID] * (n - 1) + speech[j * m : (j + 1) * m] + [fill]
    rest_text, rest_speech = text[full * n :], speech[full * m :]
    kinds += [TEXT] * len(rest_text) + [TASK_ID] + [SPEECH] * len(rest_speech)
    ids += rest_text + [0] + rest_speech
    targets += [IGNORE_ID] * len(rest_text) + rest_speech + [eos]
    assert (seq.kinds, seq.ids, seq.targets) == (kinds, ids, targets)
    # every speech token and the eos are predicted exactly once, in order
    assert [t for t in seq.targets if t not in (IGNORE_ID, fill)] == speech + [eos]


def test_bistream_needs_more_than_three_speech_tokens_per_text_token():
    assert not can_bistream(5, 15, (5, 15)) and can_bistream(5, 16, (5, 15))
    with pytest.raises(ValueError):
        bistream([1] * 5, [0] * 15, (5, 15), 50, 52)
    assert build_sequence([1] * 5, [0] * 15, (5, 15), 50, 52, 1.0, 0.0).targets.count(52) == 0  # falls back
    assert build_sequence([1] * 5, [0] * 16, (5, 15), 50, 52, 0.5, 0.7).targets.count(52) == 0  # draw >= p
    assert build_sequence([1] * 5, [0] * 16, (5, 15), 50, 52, 0.5, 0.3).targets.count(52) == 1


def test_training_forward_equals_the_inference_teacher_forcing_path(tiny):
    torch.manual_seed(0)
    lm = TextSpeechLM(tiny.lm).eval()
    text, speech = [3, 9, 27, 81], [5, 6, 7, 8, 9, 10]
    other = unistream([1, 2], [4, 4, 4], tiny.lm.eos_id)  # a shorter row: right padding must not matter
    batch = pad_sequences([unistream(text, speech, tiny.lm.eos_id), other])
    select, targets, rows = targets_of(batch)
    with torch.no_grad():
        logits = LMForTraining(lm)(batch.kinds, batch.ids, select)
        embeds = torch.cat([lm.build_input(torch.tensor([text])), lm.embed_speech(torch.tensor([speech]))], dim=1)
        ref = lm(embeds)[0, 1 + len(text) :]  # positions task_id .. last speech predict speech + eos
    torch.testing.assert_close(logits[rows == 0], ref, atol=1e-5, rtol=1e-5)
    assert targets[rows == 0].tolist() == speech + [tiny.lm.eos_id]


def test_sequence_log_probs_average_over_scored_positions_only():
    logits = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]))
    targets, rows = torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1])
    mean = sequence_log_probs(logits, targets, rows, 2)
    total = sequence_log_probs(logits, targets, rows, 2, average=False)
    torch.testing.assert_close(total, torch.log(torch.tensor([0.5 * 0.1, 0.8])))
    torch.testing.assert_close(mean, torch.tensor([(np.log(0.5) + np.log(0.1)) / 2, np.log(0.8)], dtype=torch.float32))


# ---- flow --------------------------------------------------------------------------------------------------------
def test_per_sample_masks_equal_the_shared_mask_of_each_row():
    key = padding_mask(torch.tensor([9, 6, 9, 3]), 9)
    sizes = torch.tensor([0, 1, 4, 8])
    got = per_sample_attention_mask(key, sizes)
    for b, s in enumerate(sizes.tolist()):
        assert torch.equal(got[b], attention_mask(key[b : b + 1], s)[0].expand(9, 9))


def test_encoder_and_estimator_chunk_sizes_reproduce_the_streaming_switch(tiny):
    torch.manual_seed(0)
    flow = TokenToMelFlow(tiny.flow).eval()
    enc, est = flow.encoder, flow.decoder.estimator
    x, lens = torch.randn(2, 11, 32), torch.tensor([11, 11])
    with torch.no_grad():
        for streaming, tok_chunk in ((False, 0), (True, enc.static_chunk_size)):
            a, _ = enc(x, lens, streaming=streaming)
            b, _ = enc(x, lens, chunk_sizes=torch.full((2,), tok_chunk))
            torch.testing.assert_close(a, b)
        y, mu, cond = torch.randn(3, 2, 80, 22).unbind(0)
        mask, t, spks = torch.ones(2, 1, 22), torch.rand(2), torch.randn(2, 80)
        for streaming, frames in ((False, 0), (True, est.static_chunk_size)):
            a = est(y, mask, mu, t, spks, cond, streaming=streaming)
            b = est(y, mask, mu, t, spks, cond, chunk_sizes=torch.full((2,), frames))
            torch.testing.assert_close(a, b)


def _flow_inputs(lengths, prompts, kinds, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, t_max = len(lengths), max(lengths)
    tokens = torch.randint(0, 50, (b, t_max), generator=g)
    mel = torch.randn(b, 80, 2 * t_max, generator=g)
    z = torch.randn(b, 80, 2 * t_max, generator=g)
    for i, n in enumerate(lengths):
        tokens[i, n:] = 0
        mel[i, :, 2 * n :] = 0
        z[i, :, 2 * n :] = 0
    enc = torch.tensor([{"full": 0, "causal": 1, "chunk": 4}[k] for k in kinds])
    est = torch.tensor([{"full": 0, "causal": 1, "chunk": 8}[k] for k in kinds])
    return (tokens, torch.tensor(lengths), mel, torch.randn(b, 192, generator=g), torch.tensor(prompts), enc, est,
            torch.rand(b, generator=g), z, torch.tensor([True] * b))


@pytest.mark.parametrize("kind", ["full", "causal", "chunk"])
def test_flow_loss_of_an_utterance_does_not_depend_on_batch_padding(tiny, kind):
    torch.manual_seed(0)
    model = FlowForTraining(TokenToMelFlow(tiny.flow)).eval()
    alone = _flow_inputs([7], [3], [kind])
    # the same utterance next to a longer one whose frames are all prompt (so it adds no loss frames)
    padded = _flow_inputs([7, 13], [3, 26], [kind, "full"])
    padded = tuple(torch.cat([a, p[1:]]) if a.dim() == 1 or a.size(-1) == p.size(-1)
                   else torch.cat([torch.nn.functional.pad(a, (0, p.size(-1) - a.size(-1))), p[1:]])
                   for a, p in zip(alone, padded))
    with torch.no_grad():
        loss_a, n_a = model(*alone)
        loss_p, n_p = model(*padded)
    assert n_a == n_p == 2 * 7 - 3
    torch.testing.assert_close(loss_a, loss_p, atol=1e-5, rtol=1e-5)


def test_compute_loss_accepts_the_draws_it_would_make(tiny):
    torch.manual_seed(0)
    flow = TokenToMelFlow(tiny.flow)
    x1, mu = torch.randn(2, 80, 10), torch.randn(2, 80, 10)
    mask, spks, cond = torch.ones(2, 1, 10), torch.randn(2, 80), torch.zeros(2, 80, 10)
    a, _ = flow.decoder.compute_loss(x1, mask, mu, spks, cond, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    t, z = torch.rand(2, generator=g), torch.randn(x1.shape, generator=g)
    keep = torch.rand(2, generator=g) > tiny.flow.cfm.training_cfg_rate
    b, _ = flow.decoder.compute_loss(x1, mask, mu, spks, cond, t=t, z=z, cfg_keep=keep)
    torch.testing.assert_close(a, b)


# ---- exports and configs -----------------------------------------------------------------------------------------
def test_llm_export_has_the_release_keys_in_order(cv2_dir):
    from cadenza.models.cosyvoice2.config import CosyVoice2Config as C

    cfg = C.from_files(cv2_dir / "config.yaml", cv2_dir / "CosyVoice-BlankEN" / "config.json")
    release = torch.load(cv2_dir / "llm.pt", map_location="cpu", weights_only=True)
    lm = TextSpeechLM(cfg.lm)
    lm.load_state_dict({k: v for k, v in release.items() if k != TIED_LM_HEAD_KEY}, strict=True)
    exported = tied_llm_state(lm)
    assert list(exported) == list(release)
    for k, v in release.items():
        assert torch.equal(exported[k], v), k


def test_config_round_trips_through_cosyvoice2_yaml(cv2_dir, tiny):
    fixture = CosyVoice2Config.from_files(cv2_dir / "config.yaml", cv2_dir / "CosyVoice-BlankEN" / "config.json")
    for cfg in (CosyVoice2Config.official(), fixture, tiny):
        check_writable(cfg)
        assert CosyVoice2Config.from_dict(cosyvoice2_yaml(cfg), cfg.lm.qwen) == cfg
    assert resolve_model({"dir": str(cv2_dir)}).config == fixture
    steps = dataclasses.replace(tiny, flow=dataclasses.replace(tiny.flow, cfm=dataclasses.replace(tiny.flow.cfm, n_timesteps=5)))
    check_writable(steps)  # a Cadenza key of cfm_params since 2026-12-07
    odd = dataclasses.replace(tiny, flow=dataclasses.replace(tiny.flow, cfm=dataclasses.replace(tiny.flow.cfm, noise_seed=5)))
    with pytest.raises(InputError, match="cosyvoice2.yaml"):
        check_writable(odd)


def test_qwen_body_loads_from_a_hf_checkpoint(tiny, tmp_path):
    torch.manual_seed(0)
    source = TextSpeechLM(tiny.lm)
    hf = {k[len(QWEN_BODY_PREFIX) :]: v.clone() for k, v in source.state_dict().items() if k.startswith(QWEN_BODY_PREFIX)}
    hf["lm_head.weight"] = hf["model.embed_tokens.weight"].clone()
    save_file(hf, tmp_path / "model.safetensors")
    target = TextSpeechLM(tiny.lm)
    speech_before = target.speech_embedding.weight.clone()
    assert load_qwen_body(target, tmp_path) == len(hf) - 1
    for k, v in source.state_dict().items():
        if k.startswith(QWEN_BODY_PREFIX):
            assert torch.equal(target.state_dict()[k], v)
    assert torch.equal(target.speech_embedding.weight, speech_before)
    del hf["model.norm.weight"]
    save_file(hf, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="norm"):
        load_qwen_body(target, tmp_path / "model.safetensors")


def test_warm_start_with_a_new_vocabulary_reinitialises_only_the_named_keys(tiny, tmp_path):
    torch.manual_seed(0)
    source = TokenToMelFlow(tiny.flow)
    atomic_torch_save(source.state_dict(), tmp_path / "flow.pt")
    bigger = dataclasses.replace(tiny.flow, vocab_size=tiny.flow.vocab_size + 7)
    torch.manual_seed(1)
    target = TokenToMelFlow(bigger)
    fresh = target.input_embedding.weight.clone()
    with pytest.raises(CheckpointError, match="input_embedding"):
        load_component(target, tmp_path, "flow.pt")  # strict without reinit: the shapes differ
    load_component(target, tmp_path, "flow.pt", reinit=("input_embedding.",))
    assert torch.equal(target.input_embedding.weight, fresh)
    for k, v in source.state_dict().items():
        if not k.startswith("input_embedding."):
            assert torch.equal(target.state_dict()[k], v), k
    with pytest.raises(CheckpointError, match="match no parameter"):
        load_component(target, tmp_path, "flow.pt", reinit=("no_such_layer.",))


# ---- launcher pieces ---------------------------------------------------------------------------------------------
def test_mixed_precision_follows_the_device_and_the_cpu(monkeypatch):
    from cadenza.training import launcher

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert launcher.autocast_dtype(TrainConfig.from_dict({}), cpu) is None
    assert launcher.autocast_dtype(TrainConfig.from_dict({"mixed_precision": "bf16"}), cpu) == torch.bfloat16
    auto = TrainConfig.from_dict({"mixed_precision": "auto"})
    assert launcher.autocast_dtype(auto, cuda) == torch.bfloat16
    monkeypatch.setattr(launcher, "cpu_has_native_bf16", lambda: False)
    assert launcher.autocast_dtype(auto, cpu) is None  # AVX2-only CPUs emulate bf16: slower than float32
    monkeypatch.setattr(launcher, "cpu_has_native_bf16", lambda: True)
    assert launcher.autocast_dtype(auto, cpu) == torch.bfloat16
    with pytest.raises(InputError, match="mixed_precision"):
        TrainConfig.from_dict({"mixed_precision": "fp8"})


def test_train_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(InputError, match="bach_size"):
        TrainConfig.from_dict({"bach_size": 4})
    with pytest.raises(InputError, match="schedule"):
        TrainConfig.from_dict({"optim": {"schedule": "exotic"}})
    assert TrainConfig.from_dict({"max_steps": 5}, max_steps=7).max_steps == 7


def test_lr_schedules():
    cos = OptimConfig(schedule="cosine", warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, cos, 110) == pytest.approx(0.1) and lr_factor(9, cos, 110) == pytest.approx(1.0)
    assert lr_factor(109, cos, 110) == pytest.approx(0.1)
    lin = OptimConfig(schedule="linear")
    assert lr_factor(49, lin, 100) == pytest.approx(0.5)
    inv = OptimConfig(schedule="inverse_sqrt", warmup_steps=4)
    assert lr_factor(3, inv, 100) == pytest.approx(1.0) and lr_factor(15, inv, 100) == pytest.approx(0.5)


def test_resume_keeps_the_moments_and_step_and_takes_the_config_hyper_parameters(caplog):
    """A config edited before ``--resume`` (lr, betas, weight decay) is what the resumed run trains with, at the
    schedule's step of the checkpoint; the optimiser's moments come back as they were."""
    torch.manual_seed(0)
    first = OptimConfig(lr=1e-3, schedule="cosine", warmup_steps=2, min_lr_ratio=0.1)
    weight = torch.nn.Parameter(torch.randn(4, 3))
    run = Optimization([weight], first, max_steps=20)
    for _ in range(5):
        run.step((weight ** 2).sum())
    state = run.state_dict()
    same = Optimization([weight], first, max_steps=20)
    same.load_state_dict(state)
    assert same.lr == pytest.approx(run.lr) == pytest.approx(1e-3 * lr_factor(5, first, 20))
    edited = dataclasses.replace(first, lr=4e-4, betas=(0.5, 0.9), weight_decay=0.01)
    resumed = Optimization([weight], edited, max_steps=20)
    with caplog.at_level("INFO", logger="cadenza.training.optim"):
        resumed.load_state_dict(state)
    assert resumed.lr == pytest.approx(4e-4 * lr_factor(5, first, 20))
    group = resumed.optimizer.param_groups[0]
    assert group["betas"] == (0.5, 0.9) and group["weight_decay"] == 0.01
    assert torch.equal(resumed.optimizer.state[weight]["exp_avg"], run.optimizer.state[weight]["exp_avg"])
    assert "lr 0.001 -> 0.0004" in caplog.text and "betas" in caplog.text
    resumed.step((weight ** 2).sum())  # the schedule goes on from step 5 at the new peak
    assert resumed.lr == pytest.approx(4e-4 * lr_factor(6, first, 20))


def test_registry_finds_stages_lazily_and_names_missing_ones():
    assert get_stage("lm").name == "lm" and get_stage("flow").name == "flow" and get_stage("dpo").name == "dpo"
    with pytest.raises(InputError, match="not available"):
        get_stage("no_such_stage")


def test_checkpoint_files(tmp_path):
    atomic_torch_save({"format": 1, "step": 3, "state": {"w": torch.ones(2)}, "rng": [rng_state()]},
                      tmp_path / "step_3.pt")
    ckpt = load_checkpoint(tmp_path / "step_3.pt")
    assert ckpt["step"] == 3 and [p.name for p in tmp_path.iterdir()] == ["step_3.pt"]
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "bad.pt")
    state = ckpt["rng"][0]  # RNG states survive torch.save + weights_only loading
    set_rng_state(state)
    b = (torch.rand(2), np.random.rand(2))
    set_rng_state(state)
    assert torch.equal(torch.rand(2), b[0]) and np.array_equal(np.random.rand(2), b[1])


def test_item_streams_and_the_resumable_sampler():
    assert torch.equal(torch.rand(4, generator=item_generator(1, 2, 3)), torch.rand(4, generator=item_generator(1, 2, 3)))
    assert not torch.equal(torch.rand(4, generator=item_generator(1, 2, 3)), torch.rand(4, generator=item_generator(1, 3, 3)))
    data = list(range(10))
    one = ResumableDistributedSampler(data, 1, 0, seed=7)
    two = [ResumableDistributedSampler(data, 2, r, seed=7) for r in range(2)]
    for s in [one, *two]:
        s.set_epoch(3)
    order = list(one)
    assert sorted(list(two[0]) + list(two[1])) == sorted(order[:10]) and list(two[0]) == order[0::2]
    two[0].set_start(2)
    assert list(two[0]) == order[0::2][2:] and len(two[0]) == 3


def test_preference_pairs(tmp_path):
    cands = [{"group": "a", "text_ids": [1, 2], "speech_tokens": [3, 4], "reward": 0.9},
             {"group": "a", "text_ids": [1, 2], "speech_tokens": [5, 6], "reward": 0.2},
             {"group": "a", "text_ids": [1, 2], "speech_tokens": [7, 8], "reward": 0.5},
             {"group": "b", "text": "hi", "speech_tokens": [1], "reward": 0.5},
             {"group": "b", "text": "hi", "speech_tokens": [2], "reward": 0.45}]
    pairs = make_pairs(cands, min_gap=0.1)
    assert [(p["id"], p["chosen"], p["rejected"]) for p in pairs] == [("a", [3, 4], [5, 6])]
    write_pairs(tmp_path / "p.jsonl", pairs)
    with (tmp_path / "p.jsonl").open("a") as f:
        f.write("{broken\n" + json.dumps({"text": "x", "chosen": [1], "rejected": [1]}) + "\n")
    assert len(read_pairs(tmp_path / "p.jsonl")) == 1
    with pytest.raises(InputError):
        read_pairs(tmp_path / "missing.jsonl")


def test_speaker_tags(cv2_dir, tmp_path):
    from cadenza.text.qwen_tokenizer import ENDOFPROMPT, CosyVoice2Tokenizer
    from cadenza.training.speaker_tags import SpeakerTagger

    from toy_model import _tokenizer_files, build_toy_model_dir

    # A fixture whose Qwen vocabulary cannot hold a byte-level BPE raises ValueError here: a failure, not a skip.
    model = build_toy_model_dir(cv2_dir, tmp_path / "model", with_frontend=False)
    qwen = json.loads((model / "CosyVoice-BlankEN" / "config.json").read_text())
    _tokenizer_files(model / "CosyVoice-BlankEN", qwen["vocab_size"] - 20)
    tok = CosyVoice2Tokenizer(model / "CosyVoice-BlankEN")
    tagger = SpeakerTagger(tok, {"spk1": "Speaker A"}, unknown_probability=0.3)
    end = tok.encode(ENDOFPROMPT)
    assert tagger.ids("spk1", 0.9) == tok.encode("Speaker A" + ENDOFPROMPT) and tagger.ids("spk1", 0.9)[-1:] == end
    assert tagger.ids("spk1", 0.1) == tok.encode("unknown" + ENDOFPROMPT)  # the random unknown
    assert tagger.ids("other", 0.9) == tok.encode("unknown" + ENDOFPROMPT)
    with pytest.raises(InputError, match="tokenizer"):
        SpeakerTagger(None)


def test_stages_are_registered_by_name_not_found_by_file_prefix(monkeypatch):
    from cadenza.training import registry

    assert set(registry.STAGE_NAMES) >= {"lm", "dpo", "flow", "tokenizer", "frame_tokenizer", "speaker", "hift"}
    for name in registry.STAGE_NAMES:  # every listed stage is importable and registers itself under its name
        assert get_stage(name).name == name
    # A stage from another package: listed, then found; a listed module that registers nothing is a clear error.
    monkeypatch.setitem(registry.STAGE_MODULES, "nothing_here", "cadenza.training.optim")
    with pytest.raises(InputError, match="registers no stage of that name"):
        get_stage("nothing_here")
    with pytest.raises(InputError, match="not a dotted module name"):
        registry.register_stage_module("mine", "../evil")


def test_a_manifest_with_unreadable_audio_is_refused_before_training(tmp_path):
    """A missing or undecodable clip in a manifest stopped the run when the sampler reached it (and again on resume):
    refused when the source opens, naming the files."""
    import json

    import numpy as np
    import soundfile as sf

    from cadenza.errors import InputError
    from cadenza.training.wav_manifest import open_utterances

    (tmp_path / "wavs").mkdir()
    sf.write(tmp_path / "wavs" / "a.wav", np.zeros(16000, np.float32) + 0.1, 16000)
    (tmp_path / "wavs" / "bad.wav").write_bytes(b"RIFF not audio")
    rows = [{"audio": "wavs/a.wav", "text": "a"}, {"audio": "wavs/gone.wav", "text": "b"},
            {"audio": "wavs/bad.wav", "text": "c"}]
    (tmp_path / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match=r"2 of 3 audio files cannot be read \(.*gone.wav.*bad.wav"):
        open_utterances(tmp_path, "manifest")
    (tmp_path / "manifest.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert len(open_utterances(tmp_path, "manifest")) == 1


def test_an_init_path_that_is_not_there_names_its_key():
    """``init_flow: cadenza-tinyy`` said "cadenza-tinyy not found: cadenza-tinyy", naming no key."""
    from cadenza.errors import InputError
    from cadenza.training.init_weights import component_file

    with pytest.raises(InputError, match="^flow.init_flow: 'cadenza-tinyy' is neither a model folder holding flow.pt"):
        component_file("cadenza-tinyy", "flow.pt", "flow.init_flow")
    assert component_file("cadenza-tiny", "hift.pt").name == "hift.pt"
