"""Argument types and names shared by the ``cadenza`` sub-commands."""

from __future__ import annotations

import argparse

MODEL_ENV = "CADENZA_MODEL"  # default model directory of every command (else the built-in cadenza-tiny)


def positive_int(value: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        n = int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from exc
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def nonnegative_int(value: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        n = int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}") from exc
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {n}")
    return n
