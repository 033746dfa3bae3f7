"""``voxcpm2.activation_checkpointing`` on the fixture's tiny model: the same losses and gradients (full and LoRA),
every layer of the four MiniCPM-4 stacks really recomputed in the backward pass (and only while training with
gradients), unchanged state-dict keys, and the CLI flag reaching the stage config."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from cadenza.cli.train import _arguments, _voxcpm2_config
from cadenza.models.voxcpm2.minicpm4 import MiniCPMDecoderLayer, MiniCPMModel
from cadenza.training.voxcpm2.losses import ItemNoise
from cadenza.training.voxcpm2.packer import EncodedSample
from cadenza.training.voxcpm2.stage import VoxCPM2Stage

REL_TOL = 1e-6
STACKS = ("base_lm", "residual_lm", "feat_encoder.encoder", "feat_decoder.estimator.decoder")


def _stage(fx: Path, mode: str, checkpointing: bool) -> VoxCPM2Stage:
    torch.manual_seed(0)  # the LoRA init draws from the global RNG: both stages get the same adapters
    cfg = {"train": {"batch_size": 2, "max_steps": 4, "mixed_precision": "no", "progress": False,
                     "tensorboard": False},
           "voxcpm2": {"init": str(fx / "tiny_model"), "mode": mode, "lora_r": 4, "lora_alpha": 8.0,
                       "activation_checkpointing": checkpointing}}
    stage = VoxCPM2Stage(cfg, fx)
    stage.setup(torch.device("cpu"), lambda m: m)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # non-zero lora_B, so the adapters' A matrices get gradients too
        for name, p in stage.model.named_parameters():
            if name.endswith("lora_B"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    return stage


def _batch(stage: VoxCPM2Stage):
    cfg = stage.model_config
    gen = torch.Generator().manual_seed(3)
    samples = [EncodedSample(torch.randint(10, 200, (n_text,), generator=gen).tolist(),
                             torch.randn(n_patches, cfg.patch_size, cfg.feat_dim, generator=gen))
               for n_text, n_patches in ((7, 9), (4, 6))]
    batch = stage.packer.pack(samples)
    return batch, (batch.position_ids.max(dim=1).values + 1).tolist()


def _count_layer_calls(stage: VoxCPM2Stage, calls: dict[str, int]) -> list:
    """Count every decoder layer's calls into ``calls`` (by module name); returns the hook handles. Pre-hooks: the
    backward's recomputation stops early, once it has what it needs, so post-hooks may not run."""
    def count(name: str):
        return lambda *_: calls.__setitem__(name, calls.get(name, 0) + 1)

    return [layer.register_forward_pre_hook(count(name))
            for name, layer in stage.model.named_modules() if isinstance(layer, MiniCPMDecoderLayer)]


def _loss_and_grads(stage: VoxCPM2Stage, calls: dict[str, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    batch, lengths = _batch(stage)
    noise = ItemNoise([torch.Generator().manual_seed(9 + i) for i in range(2)], lengths, batch.text_tokens.shape[1])
    hooks = _count_layer_calls(stage, calls)
    try:
        diff, stop = stage.net(batch, noise, 0.25)
        loss = diff + stop
        loss.backward()
    finally:
        for h in hooks:
            h.remove()
    return loss.detach(), {n: p.grad.clone() for n, p in stage.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_checkpointed_layers_give_the_same_loss_and_gradients(vx2_dir, mode):
    plain, ckpt = _stage(vx2_dir, mode, False), _stage(vx2_dir, mode, True)
    assert list(plain.model.state_dict()) == list(ckpt.model.state_dict())  # names untouched: checkpoints, LoRA keys
    stacks = {n for n, m in ckpt.model.named_modules() if isinstance(m, MiniCPMModel) and m.activation_checkpointing}
    assert stacks == set(STACKS)
    plain_calls: dict[str, int] = {}
    ckpt_calls: dict[str, int] = {}
    loss_a, grads_a = _loss_and_grads(plain, plain_calls)
    loss_b, grads_b = _loss_and_grads(ckpt, ckpt_calls)
    # every layer ran once without checkpointing and once more (recomputed) with it, wherever a gradient flows: LoRA
    # leaves the LocEnc frozen and nothing upstream of it trains, so its layers have no backward to recompute for
    assert plain_calls.keys() == ckpt_calls.keys() and {k.rsplit(".layers.", 1)[0] for k in plain_calls} == set(STACKS)
    frozen = ("feat_encoder.",) if mode == "lora" else ()
    expected = {k: n if k.startswith(frozen) else 2 * n for k, n in plain_calls.items()}
    assert set(plain_calls.values()) == {1} and ckpt_calls == expected, (plain_calls, ckpt_calls)
    assert torch.isfinite(loss_a) and abs(float(loss_a - loss_b)) <= REL_TOL * abs(float(loss_a))
    trainable = {n for n, p in plain.model.named_parameters() if p.requires_grad}
    assert grads_a.keys() == grads_b.keys() == trainable
    if mode == "lora":
        assert all(".lora_" in n for n in trainable)
    for name, ga in grads_a.items():
        scale = float(ga.abs().max())
        assert scale > 0, f"{name}: no gradient"
        assert float((ga - grads_b[name]).abs().max()) <= REL_TOL * scale, name


def test_no_recomputation_outside_training_with_gradients(vx2_dir):
    stage = _stage(vx2_dir, "lora", True)
    for train, grad in ((True, False), (False, True)):
        stage.model.train(train)
        calls: dict[str, int] = {}
        hooks = _count_layer_calls(stage, calls)
        batch, lengths = _batch(stage)
        with torch.set_grad_enabled(grad):
            diff, stop = stage.net(batch, ItemNoise([torch.Generator().manual_seed(i) for i in range(2)], lengths,
                                                    batch.text_tokens.shape[1]), 0.25)
            if grad:
                (diff + stop).backward()
        for h in hooks:
            h.remove()
        assert calls and set(calls.values()) == {1}, (train, grad, calls)


def test_the_cli_flag_sets_the_stage_option(vx2_dir):
    parser = argparse.ArgumentParser()
    _arguments(parser)
    base = ["voxcpm2", "--init", str(vx2_dir / "tiny_model"), "--out", "run"]
    assert _voxcpm2_config(parser.parse_args(base + ["--activation-checkpointing"]))["voxcpm2"][
        "activation_checkpointing"] is True
    assert "activation_checkpointing" not in _voxcpm2_config(parser.parse_args(base))["voxcpm2"]
