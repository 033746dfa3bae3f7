"""The launcher's own knobs (the ``train:`` section of a training config) and config-file reading.

A training config is one YAML or JSON mapping; the launcher reads only ``train:`` (``TrainConfig``) and hands the
whole mapping to the stage, which reads its own section (``lm:``, ``flow:``, ...) and ``model:``. Unknown keys in
``train:`` are errors (a typo such as ``bach_size`` must not silently fall back to a default), and so is a value of
the wrong type (``batch_size: "8"``, ``lr: fast``, ``progress: no-thanks``): every section read with
``dataclass_from_dict`` is checked against its dataclass's field types, and the message names the key.

Files are read as plain data (``yaml.safe_load``: no tags, no code), at most ``MAX_CONFIG_BYTES``, nested at most
``MAX_CONFIG_DEPTH`` deep and expanding to at most ``MAX_CONFIG_VALUES`` values through YAML aliases (a "billion
laughs" file of a few hundred bytes is refused before it is built).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cadenza.errors import InputError
from cadenza.loading.yaml_bounds import YamlTooLarge, expanded_size

SCHEDULES = ("constant", "linear", "cosine", "inverse_sqrt")
OPTIMIZERS = ("adam", "adamw")
PRECISIONS = ("no", "bf16", "auto")
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 64
MAX_CONFIG_VALUES = 100_000
MAX_SEED = 2**32 - 1  # numpy's seed range (the launcher seeds random, numpy and torch with it)


def _fail(section: str, msg: str) -> None:
    raise InputError(f"training config [{section}]: {msg}")


def _describe(value: Any) -> str:
    text = repr(value)
    return (text if len(text) <= 80 else text[:77] + "...") + f" ({type(value).__name__})"


def _type_ok(value: Any, hint: Any) -> bool:
    """Whether ``value`` (plain YAML/JSON data) fits the annotation ``hint``; unknown annotations always fit."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (tuple, list) or hint in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return False
        if not args:
            return True
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            return all(_type_ok(v, args[0]) for v in value)
        return len(value) == len(args) and all(_type_ok(v, a) for v, a in zip(value, args))
    if hint is dict or origin is dict:
        return isinstance(value, dict)
    return True  # nested configs, paths, tensors: checked by their own code


def _expected(hint: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping"}
    if hint in names:
        return names[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _expected(a) for a in args)
    plural = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}
    if origin in (tuple, list):
        if args and (origin is list or args[-1] is Ellipsis):
            return f"a list of {plural.get(args[0], 'values')}"
        if args:
            return f"a list of {len(args)} {plural.get(args[0], 'values') if len(set(args)) == 1 else 'values'}"
        return "a list"
    return getattr(hint, "__name__", str(hint))


def check_types(cls: type, data: dict[str, Any], section: str) -> None:
    """``InputError`` naming the first key of ``data`` whose value does not fit the field type of dataclass ``cls``
    (a non-finite number is refused for every float field)."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation that cannot be resolved here: leave the checks to the class
        return
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints.get(f.name, Any)
        if not _type_ok(value, hint):
            hint_yaml = ""
            if isinstance(value, str) and _type_ok(1.0, hint):
                try:
                    float(value)
                    hint_yaml = " (YAML reads numbers such as 1e-4 as text: write 1.0e-4)"
                except ValueError:
                    pass
            _fail(section, f"{f.name} must be {_expected(hint)}, got {_describe(value)}{hint_yaml}")
        if isinstance(value, float) and not math.isfinite(value):
            _fail(section, f"{f.name} must be a finite number, got {value}")


def _at_least(section: str, name: str, value: int | float, minimum: int | float) -> None:
    if value < minimum:
        _fail(section, f"{name} must be >= {minimum}, got {value}")


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
        section = "train.optim"
        check_types(OptimConfig, dataclasses.asdict(self), section)
        if self.optimizer not in OPTIMIZERS:
            _fail(section, f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            _fail(section, f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not self.lr > 0:
            _fail(section, f"lr must be > 0, got {self.lr}")
        if not self.eps > 0:
            _fail(section, f"eps must be > 0, got {self.eps}")
        _at_least(section, "warmup_steps", self.warmup_steps, 0)
        _at_least(section, "weight_decay", self.weight_decay, 0)
        if not 0 <= self.min_lr_ratio <= 1:
            _fail(section, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not all(0 <= b < 1 for b in self.betas):
            _fail(section, f"betas must be two numbers in [0, 1), got {self.betas!r}")


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
        check_types(TrainConfig, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "train")
        for name, minimum in (("batch_size", 1), ("max_steps", 1), ("num_workers", 0), ("log_every", 1),
                              ("ckpt_every", 1), ("keep_checkpoints", 0), ("seed", 0)):
            _at_least("train", name, getattr(self, name), minimum)
        if self.seed > MAX_SEED:
            _fail("train", f"seed must be at most 2**32-1, got {self.seed}")
        if self.mixed_precision not in PRECISIONS:
            _fail("train", f"mixed_precision must be one of {PRECISIONS}, got {self.mixed_precision!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            _fail("train", f"device must be auto, cpu or cuda, got {self.device!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, **overrides: Any) -> TrainConfig:
        if data is not None and not isinstance(data, dict):
            _fail("train", f"expected a mapping, got {type(data).__name__}")
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
    check_types(cls, data, section)
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
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"training config [{section}]: {exc}") from exc


def _load_yaml(text: str) -> Any:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            expanded_size(node, MAX_CONFIG_VALUES, MAX_CONFIG_DEPTH)
        except YamlTooLarge as exc:
            raise InputError(str(exc)) from None
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    problem = " ".join(problem.split())  # one line: the CLI prints one
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON training config as plain data (no tags, no code)."""
    path = Path(path)
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise InputError(f"training config {path} is {size} bytes; a config is at most {MAX_CONFIG_BYTES}")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read training config {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"training config {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    try:
        data = json.loads(text) if kind == "JSON" else _load_yaml(text)
    except InputError as exc:
        raise InputError(f"training config {path}: {exc}") from exc
    except RecursionError:
        raise InputError(f"training config {path} is nested too deeply to be a config") from None
    except yaml.YAMLError as exc:
        raise InputError(f"training config {path} is not valid YAML: {_yaml_problem(exc)}") from exc
    except ValueError as exc:
        raise InputError(f"training config {path} is not valid JSON: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"training config {path} must be a mapping at the top level, not {type(data).__name__}")
    return data


def check_sections(config: dict[str, Any], known: set[str] | frozenset[str]) -> None:
    """Top-level keys must be ``known`` sections (or start with ``_``: a place for YAML anchors), each a mapping or
    empty; ``InputError`` names the first that is not (a misspelt ``lm_:`` must not train with the defaults)."""
    for key, value in config.items():
        if not isinstance(key, str):
            raise InputError(f"training config: section names are strings, got {key!r}")
        if key.startswith("_"):
            continue
        if key not in known:
            raise InputError(f"training config: unknown section {key[:80]!r}; known: {sorted(known)} "
                             "(sections starting with '_' are ignored)")
        if value is not None and not isinstance(value, dict):
            raise InputError(f"training config [{key}]: expected a mapping, got {type(value).__name__}")
