"""Checks shared by the CosyVoice 2 config dataclasses and the yaml reader: each failure is a ``CheckpointError``
whose message names the field and shows the bad value (``config.py`` adds the file name)."""

from __future__ import annotations

import math

from cadenza.errors import CheckpointError


class InvalidConfig(CheckpointError):
    """A dataclass check failed; ``CosyVoice2Config.from_dict`` adds the file name."""


def require(cond: bool, msg: str) -> None:
    if not cond:
        raise InvalidConfig(f"invalid CosyVoice 2 config: {msg}")


def is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_real(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def int_what(minimum: int | None) -> str:
    return {1: "a positive integer", 0: "a non-negative integer", None: "an integer"}.get(
        minimum, f"an integer >= {minimum}")


def real_what(minimum: float | None, positive: bool, maximum: float | None) -> str:
    if positive:
        what = "a positive number"
    elif minimum == 0:
        what = "a non-negative number"
    elif minimum is None:
        what = "a finite number"
    else:
        what = f"a number >= {minimum:g}"
    return what + (f" <= {maximum:g}" if maximum is not None else "")


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_ints(obj: object, names: tuple[str, ...], minimum: int | None = 1) -> None:
    for name in names:
        v = getattr(obj, name)
        require(is_int(v) and (minimum is None or v >= minimum),
               f"{type(obj).__name__}.{name} must be {int_what(minimum)}, got {show(v)}")


def check_reals(obj: object, names: tuple[str, ...], minimum: float | None = 0.0, positive: bool = False,
           maximum: float | None = None) -> None:
    for name in names:
        v = getattr(obj, name)
        ok = is_real(v) and (minimum is None or v >= minimum) and (not positive or v > 0)
        require(ok and (maximum is None or v <= maximum),
               f"{type(obj).__name__}.{name} must be {real_what(minimum, positive, maximum)}, got {show(v)}")


def check_int_tuple(obj: object, name: str, length: int | None = None, nested: bool = False) -> None:
    v = getattr(obj, name)
    items = v if isinstance(v, tuple) else None
    if nested and items is not None:
        ok = len(items) > 0 and all(isinstance(t, tuple) and t and all(is_int(i) and i > 0 for i in t) for t in items)
    else:
        ok = items is not None and len(items) > 0 and all(is_int(i) and i > 0 for i in items)
    what = "a non-empty tuple of non-empty tuples of positive integers" if nested else "a non-empty tuple of positive integers"
    require(ok and (length is None or len(items) == length),
           f"{type(obj).__name__}.{name} must be {what}{f' of length {length}' if length else ''}, got {show(v)}")


def check_is(obj: object, name: str, cls: type) -> None:
    require(isinstance(getattr(obj, name), cls), f"{type(obj).__name__}.{name} must be a {cls.__name__}")
