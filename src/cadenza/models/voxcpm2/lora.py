"""LoRA adapters for VoxCPM 2: wrap target ``nn.Linear`` layers, load, enable/disable, merge/unmerge.

See docs/voxcpm2.md, "LoRA".

``LoRALinear`` replaces an ``nn.Linear`` in place and keeps its ``weight`` / ``bias`` parameters under the same names,
so base checkpoints and ``<module>.lora_A`` / ``<module>.lora_B`` adapter tensors both load unchanged:
``y = x Wᵀ + b + dropout(x Aᵀ Bᵀ) · alpha / r`` (the reference's operation order, so fp32 outputs match it).

Targets (``LoRAConfig``): ``enable_lm`` -> the ``q/k/v/o_proj`` of ``base_lm`` and ``residual_lm``; ``enable_dit`` ->
the same names inside ``feat_decoder.estimator``; ``enable_proj`` -> ``enc_to_lm_proj``, ``lm_to_dit_proj``,
``res_to_dit_proj``, ``fusion_concat_proj``. LocEnc never gets LoRA.

Checkpoint folder (written by the reference trainer): ``lora_weights.safetensors`` (or ``lora_weights.ckpt``, a
torch pickle read with ``weights_only=True``) + ``lora_config.json`` = ``{"base_model": ..., "lora_config": {...}}``.

Differences from the reference: loading is strict (the reference skips unknown keys silently; we raise
``CheckpointError`` listing unknown, missing and mis-shaped keys); disabling skips the adapter branch (the reference
multiplies it by 0 — same output for finite values); ``merge_lora`` folds ``alpha / r · B A`` into ``W`` for
adapter-free inference speed (the reference has no merge). Unmerging subtracts the same product, which restores
float32 weights up to rounding (~1e-7 relative) and bf16 weights only approximately: reload the model for
bit-exact base weights. LoRA state is model-wide: change it only while no request is running.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.errors import CheckpointError
from cadenza.loading import read_torch_state_dict
from cadenza.loading.state_dict import key_listing

CONFIG_FILE = "lora_config.json"
WEIGHT_FILES = ("lora_weights.safetensors", "lora_weights.ckpt")


@dataclass(frozen=True)
class LoRAConfig:
    """Field names and defaults of the reference's ``LoRAConfig``."""

    enable_lm: bool = False
    enable_dit: bool = False
    enable_proj: bool = False
    r: int = 8
    alpha: float = 16
    dropout: float = 0.0
    target_modules_lm: tuple[str, ...] = ("q_proj", "v_proj", "k_proj", "o_proj")
    target_modules_dit: tuple[str, ...] = ("q_proj", "v_proj", "k_proj", "o_proj")
    target_proj_modules: tuple[str, ...] = ("enc_to_lm_proj", "lm_to_dit_proj", "res_to_dit_proj", "fusion_concat_proj")

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise CheckpointError(f"LoRA rank r must be a positive integer, got {self.r!r}")
        if not math.isfinite(self.alpha) or not 0.0 <= self.dropout < 1.0:
            raise CheckpointError(f"bad LoRA alpha/dropout: {self.alpha!r}, {self.dropout!r}")
        for name in ("target_modules_lm", "target_modules_dit", "target_proj_modules"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "lora config") -> LoRAConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CheckpointError(f"{source}: unknown LoRA config keys {unknown}")
        try:
            return cls(**dict(data))
        except TypeError as exc:
            raise CheckpointError(f"{source}: {exc}") from exc

    @classmethod
    def from_json(cls, path: str | Path) -> LoRAConfig:
        """``lora_config.json`` as written by the trainer (``{"lora_config": {...}}``) or a bare config object."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read LoRA config {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise CheckpointError(f"{path}: expected a JSON object")
        return cls.from_dict(data.get("lora_config", data), str(path))


class LoRALinear(nn.Module):
    """An ``nn.Linear`` plus a rank-``r`` adapter; ``weight``/``bias`` are the wrapped layer's own parameters."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        self.weight = base.weight
        self.bias = base.bias
        w = base.weight
        # Reference init (Kaiming-uniform A, zero B: the adapter starts at 0), drawn from a private generator so that
        # wrapping layers never consumes the global RNG.
        a = torch.empty(r, self.in_features)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=torch.Generator().manual_seed(0))
        self.lora_A = nn.Parameter(a.to(device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, device=w.device, dtype=w.dtype))
        # The factor as a 0-dim tensor in the model dtype (the reference's buffer): in bf16 the product rounds the same
        self.register_buffer("scale", torch.tensor(self.scaling, dtype=w.dtype, device=w.device), persistent=False)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.enabled = True
        self.merged = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in] -> [..., out]``."""
        out = F.linear(x, self.weight, self.bias)
        if not self.enabled or self.merged:
            return out
        return out + self.dropout(F.linear(F.linear(x, self.lora_A), self.lora_B)) * self.scale

    def delta(self) -> torch.Tensor:
        """``alpha / r · B A`` ``[out, in]`` in float32."""
        return (self.lora_B.float() @ self.lora_A.float()) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        if not self.merged:
            self.weight.copy_((self.weight.float() + self.delta()).to(self.weight.dtype))
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        if self.merged:
            self.weight.copy_((self.weight.float() - self.delta()).to(self.weight.dtype))
            self.merged = False

    def to_linear(self) -> nn.Linear:
        """A plain ``nn.Linear`` sharing this layer's weight and bias (merged or not, as they are now)."""
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        lin.weight, lin.bias = self.weight, self.bias
        return lin

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, r={self.r}, alpha={self.alpha:g}, "
                f"enabled={self.enabled}, merged={self.merged}")


def lora_targets(model: nn.Module, config: LoRAConfig) -> list[str]:
    """Qualified names of the ``nn.Linear`` modules the config selects."""
    names: list[str] = []

    def by_short_name(prefix: str, wanted: tuple[str, ...]) -> None:
        root = model.get_submodule(prefix)
        for name, module in root.named_modules():
            if isinstance(module, (nn.Linear, LoRALinear)) and name.rsplit(".", 1)[-1] in wanted:
                names.append(f"{prefix}.{name}")

    if config.enable_lm:
        by_short_name("base_lm", config.target_modules_lm)
        by_short_name("residual_lm", config.target_modules_lm)
    if config.enable_dit:
        by_short_name("feat_decoder.estimator", config.target_modules_dit)
    if config.enable_proj:
        for name in config.target_proj_modules:
            if isinstance(getattr(model, name, None), (nn.Linear, LoRALinear)):
                names.append(name)
    return names


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def apply_lora(model: nn.Module, config: LoRAConfig) -> list[str]:
    """Wrap the config's target layers (adapters start at zero: B = 0). Returns the wrapped module names."""
    if lora_modules(model):
        raise CheckpointError("this model already has LoRA layers: call remove_lora(model) first")
    names = lora_targets(model, config)
    if not names:
        raise CheckpointError("the LoRA config selects no layer (enable_lm / enable_dit / enable_proj are all off?)")
    for name in names:
        _replace(model, name, LoRALinear(model.get_submodule(name), config.r, config.alpha, config.dropout))
    return names


def remove_lora(model: nn.Module, keep_merged: bool = False) -> None:
    """Put plain ``nn.Linear`` layers back (unmerging first unless ``keep_merged``)."""
    for name, module in lora_modules(model).items():
        if not keep_merged:
            module.unmerge()
        _replace(model, name, module.to_linear())


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every ``lora_A`` / ``lora_B`` tensor under its checkpoint name."""
    return {f"{name}.{p}": getattr(m, p).detach().clone() for name, m in lora_modules(model).items()
            for p in ("lora_A", "lora_B")}


@torch.no_grad()
def load_lora_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], source: str) -> None:
    """Copy adapter tensors into the model's LoRA layers strictly (unknown, missing and mis-shaped keys raise)."""
    expected = {k: v.shape for k, v in lora_state_dict(model).items()}
    if not expected:
        raise CheckpointError(f"{source}: the model has no LoRA layers (apply_lora first)")
    unknown = state_dict.keys() - expected.keys()
    missing = expected.keys() - state_dict.keys()
    mismatched = [f"{k} {tuple(state_dict[k].shape)} != {tuple(expected[k])}"
                  for k in expected.keys() & state_dict.keys() if state_dict[k].shape != expected[k]]
    if unknown or missing or mismatched:
        raise CheckpointError(
            f"{source} does not match the model's LoRA layers"
            + key_listing("unknown LoRA keys", unknown)
            + key_listing("missing LoRA keys", missing)
            + key_listing("shape mismatches (checkpoint != model)", mismatched)
        )
    modules = lora_modules(model)
    for key, value in state_dict.items():
        name, _, param = key.rpartition(".")
        module = modules[name]
        was_merged = module.merged
        module.unmerge()  # a merged layer must fold the new adapter, not the old one
        getattr(module, param).copy_(value.to(getattr(module, param).dtype))
        if was_merged:
            module.merge()


def read_lora_checkpoint(path: str | Path) -> tuple[LoRAConfig | None, dict[str, torch.Tensor], Path]:
    """``(config or None, adapter tensors, weight file)`` from a checkpoint folder or a weight file."""
    path = Path(path).expanduser()
    config = None
    if path.is_dir():
        if (path / CONFIG_FILE).is_file():
            config = LoRAConfig.from_json(path / CONFIG_FILE)
        weights = next((path / n for n in WEIGHT_FILES if (path / n).is_file()), None)
        if weights is None:
            raise CheckpointError(f"{path} holds no LoRA weights: expected {' or '.join(WEIGHT_FILES)}")
    elif path.is_file():
        weights = path
    else:
        raise CheckpointError(f"LoRA checkpoint not found: {path}")
    if weights.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            state = load_file(str(weights), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read {weights} (corrupt or truncated safetensors file): {exc}") from exc
    else:
        state = read_torch_state_dict(weights)
    return config, state, weights


def load_lora(model: nn.Module, path: str | Path, config: LoRAConfig | None = None) -> LoRAConfig:
    """Wrap the layers named by the checkpoint's ``lora_config.json`` (or ``config``) and load the adapter.

    A model that already has LoRA layers keeps them (their configuration must match the checkpoint) and only takes
    the new tensors, so adapters of one configuration can be swapped without reloading the model.
    """
    file_config, state, weights = read_lora_checkpoint(path)
    config = config or file_config
    if config is None:
        raise CheckpointError(f"{path}: no {CONFIG_FILE} next to the weights; pass the LoRAConfig explicitly")
    existing = lora_modules(model)
    if existing and (sorted(existing) != sorted(lora_targets(model, config)) or any(
            m.r != config.r or m.scaling != config.scaling for m in existing.values())):
        raise CheckpointError(f"{path}: the model's LoRA layers have another configuration; call remove_lora first")
    if not existing:
        apply_lora(model, config)
    try:
        load_lora_state_dict(model, state, str(weights))
    except CheckpointError:
        if not existing:  # leave the model as it was
            remove_lora(model)
        raise
    return config


def set_lora_enabled(model: nn.Module, enabled: bool) -> None:
    """Switch every adapter on or off (off = exactly the base model; merged layers must be unmerged first)."""
    modules = lora_modules(model).values()
    if not enabled and any(m.merged for m in modules):
        raise CheckpointError("LoRA is merged into the weights: unmerge_lora(model) before disabling it")
    for m in modules:
        m.enabled = enabled


def merge_lora(model: nn.Module) -> None:
    """Fold every enabled adapter into its base weight (faster inference; see the module docstring)."""
    for m in lora_modules(model).values():
        if m.enabled:
            m.merge()


def unmerge_lora(model: nn.Module) -> None:
    for m in lora_modules(model).values():
        m.unmerge()
