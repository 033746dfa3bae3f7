"""The speaking rates every speed control takes: 0.5 (half as fast) to 2.0 (twice as fast) (docs/controls.md)."""

from __future__ import annotations

import math

from cadenza.errors import InputError

MIN_SPEED, MAX_SPEED = 0.5, 2.0


def speed_in_range(speed: float) -> float:
    """``speed`` as a float, or ``InputError`` (a ``ValueError``) when it is outside ``[MIN_SPEED, MAX_SPEED]`` or
    not a number."""
    if not math.isfinite(speed) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise InputError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}")
    return float(speed)
