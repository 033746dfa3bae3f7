"""Reading ``config.json`` values the way the reference does (pydantic's lax mode): ``"64"`` is 64, ``"yes"`` is
true, a list is a tuple; anything else is a ``CheckpointError`` naming the key. Shared by ``config.py`` and
``audio_vae_config.py``."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from cadenza.errors import CheckpointError

_TRUE = frozenset(("1", "on", "t", "true", "y", "yes"))
_FALSE = frozenset(("0", "off", "f", "false", "n", "no"))

def from_mapping(cls: type, data: Mapping[str, Any], where: str) -> Any:
    if not isinstance(data, Mapping):
        raise CheckpointError(f"{where}: expected an object, found {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        if f.name in data:
            kwargs[f.name] = coerce(data[f.name], hints[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise CheckpointError(f"{where}: required key {f.name!r} is missing")
    try:
        return cls(**kwargs)
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {exc}") from exc


def coerce(value: Any, hint: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return coerce(value, inner, where)
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, where)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise CheckpointError(f"{where}: expected true/false, found {value!r}")
    if hint is int:
        number = value
        if isinstance(value, str):
            try:
                number = int(value.strip())
            except ValueError:
                number = _parse_float(value)
        if not isinstance(number, (int, float)) or not math.isfinite(number) or int(number) != number:
            raise CheckpointError(f"{where}: expected an integer, found {value!r}")
        return int(number)
    if hint is float:
        number = _parse_float(value) if isinstance(value, str) else value
        if not isinstance(number, (int, float)):
            raise CheckpointError(f"{where}: expected a number, found {value!r}")
        return float(number)
    if hint is str:
        if not isinstance(value, str):
            raise CheckpointError(f"{where}: expected a string, found {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise CheckpointError(f"{where}: expected a list, found {value!r}")
        item = args[0]
        if len(args) != 2 or args[1] is not Ellipsis:  # fixed-length tuple
            if len(value) != len(args):
                raise CheckpointError(f"{where}: expected {len(args)} values, found {len(value)}")
        return tuple(coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict) or hint is dict:
        if not isinstance(value, Mapping):
            raise CheckpointError(f"{where}: expected an object, found {value!r}")
        return types.MappingProxyType(dict(value))
    raise TypeError(f"unsupported config field type {hint!r} at {where}")


def _parse_float(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None
