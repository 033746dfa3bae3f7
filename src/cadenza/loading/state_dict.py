"""Safe weight-file reading and strict loading with errors that list what does not match."""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from cadenza.errors import CheckpointError

_SHOW = 12  # how many offending keys an error message lists


def read_torch_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Load a ``torch.save``d state dict with ``weights_only=True`` (never unpickles code).

    Non-tensor entries (training checkpoints carry integer ``epoch``/``step``) are dropped.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weight file not found: {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile, EOFError, ValueError, OSError) as exc:
        raise CheckpointError(f"cannot read {path} as a torch state dict (corrupt, truncated, or not a weight file): {exc}") from exc
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} does not hold a state dict (found {type(obj).__name__})")
    return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def _listing(title: str, keys: Iterable[str]) -> str:
    keys = sorted(keys)
    if not keys:
        return ""
    more = f" ... and {len(keys) - _SHOW} more" if len(keys) > _SHOW else ""
    return f"\n  {title} ({len(keys)}): " + ", ".join(keys[:_SHOW]) + more


def load_into(module: nn.Module, state_dict: dict[str, torch.Tensor], source: str, ignore: Iterable[str] = ()) -> None:
    """Copy ``state_dict`` into ``module`` strictly: every key must exist with the same shape, none may be missing.

    ``ignore`` names checkpoint keys that are known and deliberately unused (e.g. a tied lm_head).
    Raises ``CheckpointError`` listing missing, unexpected and mis-shaped keys.
    """
    ignore = set(ignore)
    expected = module.state_dict()
    given = {k: v for k, v in state_dict.items() if k not in ignore}
    missing = expected.keys() - given.keys()
    unexpected = given.keys() - expected.keys()
    mismatched = [
        f"{k} {tuple(given[k].shape)} != {tuple(expected[k].shape)}"
        for k in expected.keys() & given.keys()
        if given[k].shape != expected[k].shape
    ]
    if missing or unexpected or mismatched:
        raise CheckpointError(
            f"{source} does not match the model built from the config"
            + _listing("missing keys", missing)
            + _listing("unexpected keys", unexpected)
            + _listing("shape mismatches (checkpoint != model)", mismatched)
        )
    module.load_state_dict(given, strict=True, assign=any(p.is_meta for p in module.parameters()))
