"""VoxCPM 2 config parsing and checkpoint loading: the fixture's model directory, and broken variants of it built
in a temporary folder (files are linked or rewritten there, never changed in place)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from cadenza.errors import CheckpointError
from cadenza.models.voxcpm2.config import VoxCPM2Config
from cadenza.models.voxcpm2.loader import (
    AUDIO_VAE_FILES,
    inspect_directory,
    is_voxcpm2_dir,
    load_model,
    load_voxcpm2,
    resolve_dtype,
)
from vx2_small_checkpoints import DROP, with_changes


@pytest.fixture(scope="module")
def raw_config(vx2_model_dir: Path) -> dict:
    return json.loads((vx2_model_dir / "config.json").read_text())


def _copy_dir(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    dst.mkdir(exist_ok=True)
    for p in src.iterdir():
        if p.name not in skip:
            (dst / p.name).symlink_to(p)
    return dst


# --- config ----------------------------------------------------------------------------------------------------

def test_config_from_fixture(vx2_model_dir, raw_config):
    cfg = VoxCPM2Config.from_json(vx2_model_dir / "config.json")
    lm = raw_config["lm_config"]
    assert cfg.lm_config.hidden_size == lm["hidden_size"] and cfg.lm_config.head_dim == lm["kv_channels"]
    assert cfg.lm_config.rope_scaling.short_factor == tuple(lm["rope_scaling"]["short_factor"])
    assert cfg.residual_lm_config().num_hidden_layers == raw_config["residual_lm_num_layers"]
    assert cfg.encoder_lm_config().hidden_size == raw_config["encoder_config"]["hidden_dim"]
    assert cfg.dit_lm_config().num_key_value_heads == lm["num_key_value_heads"]  # inherited from the LM
    assert cfg.audio_vae_config["latent_dim"] == raw_config["feat_dim"]
    with pytest.raises(TypeError):
        cfg.audio_vae_config["latent_dim"] = 1  # read-only


def test_config_defaults_and_ignored_keys(raw_config):
    data = with_changes(raw_config, max_length=DROP, residual_lm_no_rope=DROP, lm_config__use_mup=DROP,
                        dit_config__mean_mode=True, unknown_key=1)
    cfg = VoxCPM2Config.from_dict(data)
    assert cfg.max_length == 8192 and cfg.residual_lm_no_rope is False and cfg.lm_config.use_mup is True
    assert cfg.dit_config.dit_mean_mode is False  # only dit_mean_mode is read, as in the reference


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"architecture": "voxcpm"}, "architecture"),
        ({"architecture": DROP}, "architecture"),
        ({"lm_config__hidden_size": DROP}, "hidden_size"),
        ({"dit_config__cfm_config": DROP}, "cfm_config"),
        ({"lm_config__hidden_size": "sixty-four"}, "integer"),
        ({"lm_config__use_mup": 2}, "true/false"),
        ({"lm_config__num_key_value_heads": 3}, "multiple"),
        ({"lm_config__rope_scaling__short_factor": [1.0, 2.0]}, "short_factor"),
        ({"dtype": "int8"}, "dtype"),
        ({"feat_dim": 8}, "latent_dim"),
        ({"encoder_config__num_heads": 3}, "encoder_config.num_heads"),  # derived LocEnc: 3 heads vs 2 kv heads
    ],
)
def test_config_errors(raw_config, changes, match):
    with pytest.raises(CheckpointError, match=match):
        VoxCPM2Config.from_dict(with_changes(raw_config, **changes))


def test_config_values_coerced_like_the_reference(raw_config):
    """The reference's pydantic schema coerces in lax mode; an unknown solver is accepted (inference is Euler)."""
    cfg = VoxCPM2Config.from_dict(with_changes(raw_config, lm_config__hidden_size=str(raw_config["lm_config"][
        "hidden_size"]), lm_config__use_mup=1, patch_size=float(raw_config["patch_size"]),
        dit_config__cfm_config__solver="rk4"))
    assert cfg.lm_config.hidden_size == raw_config["lm_config"]["hidden_size"] and cfg.lm_config.use_mup is True
    assert cfg.patch_size == raw_config["patch_size"] and cfg.dit_config.cfm_config.solver == "rk4"


def test_config_unreadable(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read"):
        VoxCPM2Config.from_json(tmp_path / "config.json")
    assert not is_voxcpm2_dir(tmp_path)


def test_a_bad_config_of_a_voxcpm2_folder_is_named_as_such(vx2_model_dir, tmp_path):
    """A VoxCPM 2 folder whose config.json is missing, not JSON or without its architecture was reported as "not a
    CosyVoice 2 model directory: missing llm.pt, flow.pt, hift.pt": the other family's files, not the real problem."""
    import shutil

    import cadenza

    folder = tmp_path / "vx2"
    shutil.copytree(vx2_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    for content, says in (("{not json", "is not a readable JSON object"),
                          (json.dumps({k: v for k, v in config.items() if k != "architecture"}),
                           "names architecture None; a VoxCPM 2 folder's says \"voxcpm2\""), (None, "no config.json")):
        if content is None:
            (folder / "config.json").unlink()
        else:
            (folder / "config.json").write_text(content)
        with pytest.raises(CheckpointError, match=says) as info:
            cadenza.load(folder)
        assert "llm.pt" not in str(info.value)


# --- directory and weights ---------------------------------------------------------------------------------------

def test_load_fixture_directory(vx2_model_dir):
    loaded = load_voxcpm2(vx2_model_dir)
    assert is_voxcpm2_dir(vx2_model_dir)
    assert loaded.files.audio_vae.name in AUDIO_VAE_FILES
    assert not loaded.model.training and loaded.model.dtype == torch.float32
    assert not any(p.is_meta for p in loaded.model.parameters())
    state = load_file(str(vx2_model_dir / "model.safetensors"))
    got = loaded.model.state_dict()
    assert got.keys() == state.keys()
    assert all(torch.equal(got[k], v) for k, v in state.items())
    assert loaded.tokenizer.vocab_size <= loaded.config.lm_config.vocab_size


def test_missing_files_are_all_listed(vx2_model_dir, tmp_path):
    d = _copy_dir(vx2_model_dir, tmp_path / "m", skip=("model.safetensors", "tokenizer.json", *AUDIO_VAE_FILES))
    with pytest.raises(CheckpointError) as err:
        inspect_directory(d)
    for name in ("model.safetensors", "tokenizer.json", "audiovae.pth"):
        assert name in str(err.value)
    with pytest.raises(CheckpointError, match="not found"):
        inspect_directory(tmp_path / "nowhere")


def test_strict_keys(vx2_model_dir, tmp_path):
    state = load_file(str(vx2_model_dir / "model.safetensors"))
    state.pop("stop_head.weight")
    state["extra.weight"] = torch.zeros(1)
    state["stop_proj.bias"] = torch.zeros(3)
    d = _copy_dir(vx2_model_dir, tmp_path / "m", skip=("model.safetensors",))
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_model(d)
    msg = str(err.value)
    assert "stop_head.weight" in msg and "extra.weight" in msg and "stop_proj.bias" in msg


def test_corrupt_weights(vx2_model_dir, tmp_path):
    d = _copy_dir(vx2_model_dir, tmp_path / "m", skip=("model.safetensors",))
    (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(d)


def test_bf16_file_and_dtypes(vx2_model_dir, tmp_path):
    """The release stores bf16: it loads into float32 (CPU default) and into bf16 on request."""
    state = {k: v.to(torch.bfloat16) for k, v in load_file(str(vx2_model_dir / "model.safetensors")).items()}
    d = _copy_dir(vx2_model_dir, tmp_path / "m", skip=("model.safetensors",))
    save_file(state, str(d / "model.safetensors"))
    fp32 = load_model(d)
    assert fp32.dtype == torch.float32
    assert torch.equal(fp32.stop_proj.weight, state["stop_proj.weight"].float())
    bf16 = load_model(d, dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())


def test_pytorch_bin_fallback(vx2_model_dir, tmp_path):
    d = _copy_dir(vx2_model_dir, tmp_path / "m", skip=("model.safetensors",))
    torch.save({"state_dict": load_file(str(vx2_model_dir / "model.safetensors"))}, d / "pytorch_model.bin")
    assert inspect_directory(d).weights.name == "pytorch_model.bin"
    assert load_model(d).stop_head.weight.shape[0] == 2


def test_resolve_dtype(vx2_model_dir):
    cfg = VoxCPM2Config.from_json(vx2_model_dir / "config.json")
    assert resolve_dtype(None, "cpu", cfg) == torch.float32
    bf16_cfg = VoxCPM2Config.from_dict({**json.loads((vx2_model_dir / "config.json").read_text()), "dtype": "bfloat16"})
    assert resolve_dtype(None, "cuda", bf16_cfg) == torch.bfloat16
    assert resolve_dtype("fp16", "cpu", cfg) == torch.float16
    with pytest.raises(CheckpointError):
        resolve_dtype("int8", "cpu", cfg)
    with pytest.raises(CheckpointError):
        resolve_dtype(torch.int64, "cpu", cfg)
