"""Argument types and names shared by the ``cadenza`` sub-commands."""

from __future__ import annotations

import argparse

MODEL_ENV = "CADENZA_MODEL"  # default model directory of every command (else the built-in cadenza-tiny)


def _int_at_least(value: str, minimum: int, what: str) -> int:
    try:
        n = int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from exc
    if n < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}, got {n}")
    return n


def positive_int(value: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(value, 1, "a positive integer")


def nonnegative_int(value: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(value, 0, "an integer >= 0")
