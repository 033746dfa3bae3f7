"""VoxCPM 2 LoRA: load the fixture adapter (``tiny_lora/``), parity with ``gen_lora_zero_shot.safetensors``
(README §8), enable/disable (disabled = base model exactly), merge/unmerge, strict keys, removal.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.errors import CheckpointError
from cadenza.models.voxcpm2 import lora
from cadenza.models.voxcpm2.generate import GenerationOptions, generate_latents
from cadenza.models.voxcpm2.layouts import SequenceLayout
from cadenza.models.voxcpm2.loader import load_model
from helpers import assert_close

GEN_TOL = 2e-3  # README: whole generations
MERGE_TOL = 1e-4  # merged weights change float rounding only


@pytest.fixture(scope="module", autouse=True)
def _requires_tiny_lora(vx2_dir: Path) -> None:
    """Every test here needs the fixture's ``tiny_lora/`` adapter as well as the shared folder (tests/conftest.py)."""
    if not (vx2_dir / "tiny_lora").is_dir():
        pytest.skip("the fixture set has no tiny_lora/")


@pytest.fixture(scope="module")
def expected(vx2_dir: Path) -> dict:
    return load_file(str(vx2_dir / "gen_lora_zero_shot.safetensors"))


@pytest.fixture()
def model(vx2_dir: Path):
    return load_model(vx2_dir / "tiny_model", dtype=torch.float32)


@pytest.fixture(scope="module")
def layout(vx2_dir: Path) -> SequenceLayout:
    g = load_file(str(vx2_dir / "gen_zero_shot.safetensors"))
    return SequenceLayout(g["seq_text_token"][0], g["seq_text_mask"][0], g["seq_audio_feat"][0], g["seq_audio_mask"][0])


def _options(case: dict) -> GenerationOptions:
    kw = case["inference_kwargs"]
    return GenerationOptions(min_len=kw["min_len"], max_len=kw["max_len"], inference_timesteps=kw["inference_timesteps"],
                             cfg_value=kw["cfg_value"])


def _run(model, layout, case, noise):
    steps = []
    result = generate_latents(model, layout, _options(case), noise=noise, on_step=steps.append)
    return result, steps


def test_engine_with_lora_matches_reference(vx2_dir, vx2_manifest, expected):
    case = vx2_manifest["lora"]
    engine = VoxCPM2Engine.from_pretrained(vx2_dir / "tiny_model", lora=vx2_dir / "tiny_lora")
    assert len(lora.lora_state_dict(engine.model)) == case["n_lora_tensors_loaded"]
    kw = case["inference_kwargs"]
    req = engine.build(case["target_text"], seed=case["seed"], retry=False, min_len=kw["min_len"], max_len=kw["max_len"])
    wav = engine.synthesize(req)
    assert req.target_len == len(case["target_text_token_ids"])
    assert req.outcome.attempts[0].n_patches == case["n_patches"]
    assert_close(req.outcome.result.patches, expected["step_patch"][:, 0], GEN_TOL, "LoRA patches")
    assert_close(wav, expected["wav_out"][0], GEN_TOL, "LoRA waveform")


def test_lora_steps_with_replayed_noise(model, layout, vx2_manifest, expected, vx2_dir):
    case = vx2_manifest["lora"]
    config = lora.load_lora(model, vx2_dir / "tiny_lora")
    assert config.scaling == config.alpha / config.r
    result, steps = _run(model, layout, case, expected["noise"])
    assert [int(s.stop_logits.argmax()) for s in steps] == case["stop_flags"]
    assert_close(torch.cat([s.lm_hidden for s in steps]), expected["step_lm_hidden"], GEN_TOL, "LoRA lm_hidden")
    assert_close(result.stop_logits, expected["step_stop_logits"], GEN_TOL, "LoRA stop logits")
    assert_close(result.patches, expected["step_patch"][:, 0], GEN_TOL, "LoRA patches")


def test_disabled_lora_is_the_base_model(model, layout, vx2_manifest, vx2_dir):
    base_case = vx2_manifest["generation"]["zero_shot"]
    g = load_file(str(vx2_dir / "gen_zero_shot.safetensors"))
    base, _ = _run(model, layout, base_case, g["noise"])
    lora.load_lora(model, vx2_dir / "tiny_lora")
    lora.set_lora_enabled(model, False)
    off, _ = _run(model, layout, base_case, g["noise"])
    assert torch.equal(off.patches, base.patches)  # bit-identical (manifest.lora.lora_disabled_equals_base)
    assert_close(off.patches, g["generated_feat"], GEN_TOL, "disabled LoRA vs reference base run")
    lora.set_lora_enabled(model, True)
    on, _ = _run(model, layout, base_case, g["noise"])
    assert not torch.equal(on.patches[:1], base.patches[:1])


def test_merge_and_unmerge(model, layout, vx2_manifest, expected, vx2_dir):
    case = vx2_manifest["lora"]
    base_weights = {k: v.clone() for k, v in model.state_dict().items()}
    lora.load_lora(model, vx2_dir / "tiny_lora")
    unmerged, _ = _run(model, layout, case, expected["noise"])
    lora.merge_lora(model)
    assert all(m.merged for m in lora.lora_modules(model).values())
    merged, _ = _run(model, layout, case, expected["noise"])
    assert_close(merged.patches, unmerged.patches, MERGE_TOL, "merged vs adapter branch")
    with pytest.raises(CheckpointError, match="unmerge"):
        lora.set_lora_enabled(model, False)
    lora.unmerge_lora(model)
    for name, value in model.state_dict().items():
        if name in base_weights:
            assert_close(value, base_weights[name], 1e-6, f"{name} after unmerge")
    lora.remove_lora(model)
    assert not lora.lora_modules(model)
    assert set(model.state_dict()) == set(base_weights)
    assert all(type(m) is torch.nn.Linear for n, m in model.named_modules() if n.endswith("q_proj"))


def test_remove_keep_merged_folds_adapter(model, layout, vx2_manifest, expected, vx2_dir):
    case = vx2_manifest["lora"]
    lora.load_lora(model, vx2_dir / "tiny_lora")
    lora.merge_lora(model)
    lora.remove_lora(model, keep_merged=True)
    folded, _ = _run(model, layout, case, expected["noise"])
    assert_close(folded.patches, expected["step_patch"][:, 0], GEN_TOL, "plain Linear with folded LoRA")


def test_strict_keys(model, vx2_dir, tmp_path):
    state = load_file(str(vx2_dir / "tiny_lora" / "lora_weights.safetensors"))
    config = lora.LoRAConfig.from_json(vx2_dir / "tiny_lora" / "lora_config.json")

    def write(name: str, tensors: dict) -> Path:
        d = tmp_path / name
        d.mkdir()
        shutil.copy(vx2_dir / "tiny_lora" / "lora_config.json", d / "lora_config.json")
        save_file(tensors, str(d / "lora_weights.safetensors"))
        return d

    extra = write("extra", {**state, "feat_encoder.encoder.layers.0.self_attn.q_proj.lora_A": torch.zeros(1, 1)})
    with pytest.raises(CheckpointError, match="unknown LoRA keys.*feat_encoder.encoder.layers.0.self_attn.q_proj"):
        lora.load_lora(model, extra)
    assert not lora.lora_modules(model)  # a failed load leaves the model as it was
    first = sorted(state)[0]
    missing = write("missing", {k: v for k, v in state.items() if k != first})
    with pytest.raises(CheckpointError, match=f"missing LoRA keys.*{first}"):
        lora.load_lora(model, missing)
    shaped = write("shaped", {**state, first: torch.zeros(state[first].shape[0] + 1, state[first].shape[1])})
    with pytest.raises(CheckpointError, match="shape mismatches"):
        lora.load_lora(model, shaped)
    other = lora.LoRAConfig(**{**config.__dict__, "r": config.r + 1})
    lora.apply_lora(model, other)
    with pytest.raises(CheckpointError, match="another configuration"):
        lora.load_lora(model, vx2_dir / "tiny_lora")
    with pytest.raises(CheckpointError, match="already has LoRA"):
        lora.apply_lora(model, config)
    with pytest.raises(CheckpointError, match="not found"):
        lora.load_lora(model, tmp_path / "nowhere")
    bare = tmp_path / "bare"
    bare.mkdir()
    save_file(state, str(bare / "lora_weights.safetensors"))
    with pytest.raises(CheckpointError, match="lora_config.json"):
        lora.load_lora(model, bare)
    (tmp_path / "badcfg.json").write_text(json.dumps({"lora_config": {"rank": 4}}))
    with pytest.raises(CheckpointError, match="unknown LoRA config keys"):
        lora.LoRAConfig.from_json(tmp_path / "badcfg.json")


def test_ckpt_format_and_swap(model, vx2_dir, tmp_path, layout, vx2_manifest, expected):
    """``lora_weights.ckpt`` (torch pickle ``{"state_dict": ...}``) loads too; loading again swaps the tensors."""
    state = load_file(str(vx2_dir / "tiny_lora" / "lora_weights.safetensors"))
    d = tmp_path / "ckpt"
    d.mkdir()
    shutil.copy(vx2_dir / "tiny_lora" / "lora_config.json", d / "lora_config.json")
    torch.save({"state_dict": {k: torch.zeros_like(v) for k, v in state.items()}}, d / "lora_weights.ckpt")
    lora.load_lora(model, d)
    assert all(float(v.abs().sum()) == 0 for v in lora.lora_state_dict(model).values())
    lora.load_lora(model, vx2_dir / "tiny_lora")  # same configuration: tensors replaced in place
    result, _ = _run(model, layout, vx2_manifest["lora"], expected["noise"])
    assert_close(result.patches, expected["step_patch"][:, 0], GEN_TOL, "swapped-in adapter")


def test_applying_lora_leaves_global_rng_alone(model, vx2_dir):
    state = torch.random.get_rng_state()
    config = lora.LoRAConfig.from_json(vx2_dir / "tiny_lora" / "lora_config.json")
    names = lora.apply_lora(model, config)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not any(n.startswith("feat_encoder") for n in names)  # LocEnc never gets LoRA
    assert all(float(m.lora_B.detach().abs().sum()) == 0 for m in lora.lora_modules(model).values())  # starts as a no-op


def test_engine_lora_switches(vx2_dir, vx2_manifest):
    engine = VoxCPM2Engine.from_pretrained(vx2_dir / "tiny_model")
    case = vx2_manifest["lora"]
    kw = case["inference_kwargs"]

    def run() -> np.ndarray:
        return engine.synthesize(engine.build(case["target_text"], seed=case["seed"], retry=False,
                                              min_len=kw["min_len"], max_len=kw["max_len"]))

    base = run()
    engine.load_lora(vx2_dir / "tiny_lora")
    with_lora = run()
    engine.set_lora_enabled(False)
    assert np.array_equal(run(), base)
    engine.set_lora_enabled(True)
    engine.merge_lora()
    assert_close(run(), with_lora, MERGE_TOL, "merged engine")
    engine.unmerge_lora()
    engine.remove_lora()
    assert_close(run(), base, 1e-5, "after removal")
