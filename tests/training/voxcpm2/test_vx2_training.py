"""VoxCPM 2 training: the packer and the diffusion + stop losses against ``training.safetensors`` (README §9, replayed
random draws), plus gradients, LoRA-only training, prompt-style samples and truncation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cadenza.errors import InputError
from cadenza.models.voxcpm2 import lora
from cadenza.models.voxcpm2.audio_vae_loader import load_audio_vae
from cadenza.models.voxcpm2.loader import load_model
from cadenza.training.voxcpm2 import PackedBatch, TrainingNoise, TrainingSample, VoxCPM2Packer, voxcpm2_losses
from helpers import assert_close

FEAT_TOL = 1e-5  # README: single blocks (AudioVAE encoder)
LOSS_TOL = 1e-5  # a few stack passes reduced to two scalars


@pytest.fixture(scope="module", autouse=True)
def _requires_training_fixture(vx2_dir: Path) -> None:
    """Every test here needs ``training.safetensors`` as well as the shared folder (tests/conftest.py)."""
    if not (vx2_dir / "training.safetensors").is_file():
        pytest.skip(f"VoxCPM 2 training fixtures not found at {vx2_dir} (set CADENZA_FIXTURES_VOXCPM2)")


@pytest.fixture(scope="module")
def t(vx2_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(vx2_dir / "training.safetensors"))


@pytest.fixture()
def model(vx2_dir: Path):
    return load_model(vx2_dir / "tiny_model", dtype=torch.float32).train()


@pytest.fixture(scope="module")
def packer(vx2_dir: Path) -> VoxCPM2Packer:
    vae = load_audio_vae(vx2_dir / "tiny_model")
    config = load_model(vx2_dir / "tiny_model").config
    return VoxCPM2Packer(vae, config.patch_size, config.feat_dim, max_len=config.max_length, dataset_count=1,
                         special=config.special_tokens)


@pytest.fixture(scope="module")
def batch(packer, t) -> PackedBatch:
    n = t["in_audio_tokens"].shape[0]
    samples = packer.from_padded(t["in_audio_tokens"], t["in_text_tokens"], torch.zeros(n, dtype=torch.long),
                                 [False] * n, t.get("in_ref_audio_tokens"))
    return packer(samples)


def _replay(t: dict) -> TrainingNoise:
    return TrainingNoise(replay=[t[k] for k in sorted(k for k in t if k.startswith("rng_"))])


def test_packer_matches_reference(batch, t):
    for name, value in batch.__dict__.items():
        ref = t[f"packed_{name}"]
        assert value.dtype == ref.dtype and value.shape == ref.shape, name
        if value.is_floating_point():
            assert_close(value, ref, FEAT_TOL, name)
        else:
            assert torch.equal(value, ref), name


def test_losses_match_reference(model, batch, t, vx2_manifest):
    noise = _replay(t)
    out = voxcpm2_losses(model, batch, progress=vx2_manifest["training"]["progress"], noise=noise)
    assert [kind for kind, _ in noise.drawn] == [k.removesuffix("_like") for k in vx2_manifest["training"]["rng_call_order"]]
    assert_close(out.diff.detach(), t["loss_diff"][0], LOSS_TOL, "loss/diff")
    assert_close(out.stop.detach(), t["loss_stop"][0], LOSS_TOL, "loss/stop")
    assert_close(out.total(grad_accum_steps=2).detach(), (t["loss_diff"][0] + t["loss_stop"][0]) / 2, LOSS_TOL, "total")


def test_gradients_reach_every_trained_module(model, batch, t, vx2_manifest):
    out = voxcpm2_losses(model, batch, progress=vx2_manifest["training"]["progress"], noise=_replay(t))
    out.total().backward()
    for name in ("base_lm.layers.0.self_attn.q_proj.weight", "residual_lm.layers.0.mlp.up_proj.weight",
                 "feat_encoder.in_proj.weight", "feat_decoder.estimator.out_proj.weight", "fsq_layer.in_proj.weight",
                 "stop_head.weight", "base_lm.embed_tokens.weight"):
        grad = model.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name


def test_lora_only_training(model, batch, t, vx2_manifest, vx2_dir):
    config = lora.LoRAConfig.from_json(vx2_dir / "tiny_lora" / "lora_config.json")
    lora.apply_lora(model, config)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    base = voxcpm2_losses(model, batch, progress=vx2_manifest["training"]["progress"], noise=_replay(t))
    assert_close(base.diff.detach(), t["loss_diff"][0], LOSS_TOL, "fresh adapters change nothing")
    base.total().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all(g is not None for g in grads.values())
    assert any(float(g.abs().sum()) > 0 for n, g in grads.items() if n.endswith("lora_B"))


def test_generator_noise_is_reproducible(model, batch):
    a = voxcpm2_losses(model, batch, noise=TrainingNoise(torch.Generator().manual_seed(5)))
    b = voxcpm2_losses(model, batch, noise=TrainingNoise(torch.Generator().manual_seed(5)))
    assert torch.equal(a.diff, b.diff) and torch.equal(a.stop, b.stop)
    with pytest.raises(InputError, match="replayed"):
        voxcpm2_losses(model, batch, noise=TrainingNoise(replay=[]))


def test_prompt_style_and_truncation(packer, t):
    audio = t["in_audio_tokens"][0]
    audio = audio[audio != -100]
    text = [i for i in t["in_text_tokens"][0].tolist() if i != -100]
    sp = packer.special
    prompt = packer([TrainingSample(text, audio, is_prompt=True, dataset_id=2)])
    n = len(text)
    assert prompt.text_tokens[0, n] == sp.ref_audio_start and prompt.text_tokens[0, -1] == sp.ref_audio_end
    assert prompt.loss_mask.sum() == 0 and prompt.labels[0, -2] == 1
    assert prompt.audio_duration_consumed.shape == (3,) and prompt.text_token_consumed[2] == n
    assert prompt.audio_dataset_ids.max() == 3  # dataset id + 1 at audio positions
    short = VoxCPM2Packer(packer.vae, packer.patch_size, packer.feat_dim, max_len=n, special=sp)
    cut = short([TrainingSample(text, audio)])
    assert cut.text_tokens.shape == (1, n) and torch.equal(cut.position_ids[0], torch.arange(n))
    with pytest.raises(InputError):
        packer([])
    with pytest.raises(InputError):
        TrainingSample([], audio)


def test_a_t_scheduler_training_cannot_use_is_refused(model, batch, monkeypatch):
    """Such a config loads (inference ignores the schedule, as the reference does); training must not guess one."""
    import dataclasses

    from cadenza.errors import CheckpointError

    dit = model.config.dit_config
    odd = dataclasses.replace(dit, cfm_config=dataclasses.replace(dit.cfm_config, t_scheduler="cosine"))
    monkeypatch.setattr(model, "config", dataclasses.replace(model.config, dit_config=odd))
    with pytest.raises(CheckpointError, match="t_scheduler 'cosine' cannot be trained"):
        voxcpm2_losses(model, batch, noise=TrainingNoise(torch.Generator().manual_seed(5)))
