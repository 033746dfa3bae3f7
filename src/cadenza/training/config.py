"""The launcher's own knobs (the ``train:`` section of a training config) and config-file reading.

A training config is one YAML or JSON mapping; the launcher reads only ``train:`` (``TrainConfig``) and hands the
whole mapping to the stage, which reads its own section (``lm:``, ``flow:``, ...) and ``model:``. Unknown keys in
``train:`` are errors (a typo such as ``bach_size`` must not silently fall back to a default).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cadenza.errors import InputError

SCHEDULES = ("constant", "linear", "cosine", "inverse_sqrt")
OPTIMIZERS = ("adam", "adamw")
PRECISIONS = ("no", "bf16", "auto")


def _fail(section: str, msg: str) -> None:
    raise InputError(f"training config [{section}]: {msg}")


@dataclass(frozen=True)
class OptimConfig:
    """Optimiser and learning-rate schedule shared by the stages (``train.optim``).

    ``schedule``: ``constant`` (after warm-up), ``linear`` / ``cosine`` decay to ``min_lr_ratio * lr`` at
    ``max_steps``, or ``inverse_sqrt`` (the reference's ``WarmupLR``: ``lr * min(s/w, sqrt(w/s))``). Warm-up is
    linear from 0 over ``warmup_steps``. ``grad_clip`` <= 0 disables clipping (the reference clips at 5).
    """

    optimizer: str = "adam"
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    schedule: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    grad_clip: float = 5.0

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            _fail("train.optim", f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            _fail("train.optim", f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not self.lr > 0 or self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1 or self.weight_decay < 0:
            _fail("train.optim", "need lr > 0, warmup_steps >= 0, 0 <= min_lr_ratio <= 1, weight_decay >= 0")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            _fail("train.optim", f"betas must be two numbers in [0, 1), got {self.betas!r}")


@dataclass(frozen=True)
class TrainConfig:
    """What the launcher controls. ``batch_size`` is per process: ``torchrun --nproc_per_node N`` trains with an
    effective batch of ``N * batch_size``. Steps count optimiser steps (one batch each)."""

    batch_size: int = 8
    max_steps: int = 1000
    seed: int = 1234
    num_workers: int = 0
    log_every: int = 10
    ckpt_every: int = 1000
    keep_checkpoints: int = 3  # newest checkpoints kept on disk; 0 keeps all
    # "bf16": autocast around train_step (CUDA, or a CPU; no loss scaling needed); "auto": bf16 on CUDA and on CPUs
    # with native bf16 matrix units (AMX / AVX512-BF16), float32 elsewhere (bf16 is emulated, and slow, on AVX2).
    mixed_precision: str = "no"
    device: str = "auto"  # auto (CUDA if available) | cpu | cuda
    progress: bool = True
    tensorboard: bool = True
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_steps < 1:
            _fail("train", "batch_size and max_steps must be >= 1")
        if self.num_workers < 0 or self.log_every < 1 or self.ckpt_every < 1 or self.keep_checkpoints < 0:
            _fail("train", "need num_workers >= 0, log_every >= 1, ckpt_every >= 1, keep_checkpoints >= 0")
        if self.mixed_precision not in PRECISIONS:
            _fail("train", f"mixed_precision must be one of {PRECISIONS}, got {self.mixed_precision!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            _fail("train", f"device must be auto, cpu or cuda, got {self.device!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, **overrides: Any) -> TrainConfig:
        data = dict(data or {})
        data.update({k: v for k, v in overrides.items() if v is not None})
        optim = data.pop("optim", None) or {}
        return cls(optim=dataclass_from_dict(OptimConfig, optim, "train.optim"), **_checked(cls, data, "train"))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _checked(cls: type, data: dict[str, Any], section: str) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        _fail(section, f"unknown keys {unknown}; known: {sorted(names)}")
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            value = data[f.name]
            out[f.name] = tuple(value) if isinstance(value, list) else value
    return out


def dataclass_from_dict(cls: type, data: dict[str, Any] | None, section: str) -> Any:
    """Build a flat config dataclass from a mapping; unknown keys are errors, lists become tuples."""
    if data is not None and not isinstance(data, dict):
        _fail(section, f"expected a mapping, got {type(data).__name__}")
    try:
        return cls(**_checked(cls, dict(data or {}), section))
    except TypeError as exc:
        raise InputError(f"training config [{section}]: {exc}") from exc


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON training config as plain data (no tags, no code)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read training config {path}: {exc}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise InputError(f"training config {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"training config {path} must be a mapping at the top level")
    return data
