"""Shared helpers of the VoxCPM 2 LoRA tests (no tests here)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from cadenza.models.voxcpm2.loader import load_model
from cadenza.models.voxcpm2.lora import LoRAConfig


def make_adapter(model_dir: Path, out: Path, seed: int = 5, r: int = 2, scale: float = 0.3) -> Path:
    """A second adapter unlike the fixture's: rank 2, both LMs only (fewer layers, another rank), random tensors."""
    model = load_model(model_dir, dtype=torch.float32)
    config = LoRAConfig(enable_lm=True, r=r, alpha=4)
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, module in model.named_modules():
        short = name.rsplit(".", 1)[-1]
        if name.startswith(("base_lm.", "residual_lm.")) and short in config.target_modules_lm:
            state[f"{name}.lora_A"] = torch.randn(r, module.in_features, generator=gen) * scale
            state[f"{name}.lora_B"] = torch.randn(module.out_features, r, generator=gen) * scale
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "lora_weights.safetensors"))
    (out / "lora_config.json").write_text(json.dumps({"base_model": "tiny_model", "lora_config": {
        "enable_lm": True, "r": r, "alpha": 4}}))
    return out
