"""Safe weight-file reading and strict loading with errors that list what does not match."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from cadenza.errors import CheckpointError
from cadenza.loading.files import check_file

_SHOW = 12  # how many offending keys an error message lists


def read_torch_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Load a ``torch.save``d state dict with ``weights_only=True`` (never unpickles code).

    Non-tensor entries (training checkpoints carry integer ``epoch``/``step``) are dropped. Raises
    ``CheckpointError`` naming the file for anything else: missing, a directory, empty, truncated, not a torch
    file, a pickle that asks for code, keys that are not strings, sparse or otherwise non-dense tensors.
    """
    path = check_file(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure of torch's reader on a user file means a bad file
        raise CheckpointError(f"cannot read {path} as a torch state dict (corrupt, truncated, not a weight file, or "
                              f"a pickle that would run code): {type(exc).__name__}: {exc}") from exc
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} does not hold a state dict (found {type(obj).__name__})")
    out: dict[str, torch.Tensor] = {}
    for key, value in obj.items():
        if not isinstance(value, torch.Tensor):
            continue
        if not isinstance(key, str):
            raise CheckpointError(f"{path}: state-dict key {key!r} is not a string")
        if value.layout != torch.strided or value.is_meta or value.is_quantized:
            raise CheckpointError(f"{path}: {key} is not a plain dense tensor (layout {value.layout})")
        out[key] = value
    return out


def key_listing(title: str, keys: Iterable[str]) -> str:
    """An error message's line naming ``keys`` (the first few, sorted), or "" for none."""
    keys = sorted(keys)
    if not keys:
        return ""
    more = f" ... and {len(keys) - _SHOW} more" if len(keys) > _SHOW else ""
    return f"\n  {title} ({len(keys)}): " + ", ".join(keys[:_SHOW]) + more


def _kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    if t.is_complex():
        return "complex"
    return "float" if t.is_floating_point() else "integer"


def _finite(t: torch.Tensor) -> bool:
    """No NaN or inf in ``t``: min and max propagate both, and one reduction allocates nothing (``isfinite().all()``
    is ~10x slower on large weights)."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t.detach())
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def load_into(module: nn.Module, state_dict: dict[str, torch.Tensor], source: str, ignore: Iterable[str] = ()) -> None:
    """Copy ``state_dict`` into ``module`` strictly: every key must exist with the same shape, float parameters must
    be given as finite float tensors, none may be missing.

    ``ignore`` names checkpoint keys that are known and deliberately unused (e.g. a tied lm_head).
    Raises ``CheckpointError`` listing missing, unexpected, mis-shaped, mis-typed and non-finite keys; the module
    is left untouched then (every check runs before the first tensor is copied).
    """
    ignore = set(ignore)
    expected = module.state_dict()
    given = {k: v for k, v in state_dict.items() if k not in ignore}
    missing = expected.keys() - given.keys()
    unexpected = given.keys() - expected.keys()
    common = expected.keys() & given.keys()
    mismatched = [f"{k} {tuple(given[k].shape)} != {tuple(expected[k].shape)}"
                  for k in common if given[k].shape != expected[k].shape]
    # A float parameter given as integers would stay integer when assigned; the reverse (BatchNorm's
    # num_batches_tracked saved as float32 by BundleFormat) is cast on copy and harmless.
    mistyped = [f"{k} {given[k].dtype} (the model needs a float tensor)"
                for k in common if _kind(expected[k]) == "float" and _kind(given[k]) != "float"]
    # NaN/inf weights load fine and then make every request produce NaN audio; one pass over the weights finds them.
    non_finite = [k for k in common if given[k].is_floating_point() and given[k].shape == expected[k].shape
                  and not _finite(given[k])]
    if missing or unexpected or mismatched or mistyped or non_finite:
        raise CheckpointError(
            f"{source} does not match the model built from the config"
            + key_listing("missing keys", missing)
            + key_listing("unexpected keys", unexpected)
            + key_listing("shape mismatches (checkpoint != model)", mismatched)
            + key_listing("wrong dtypes", mistyped)
            + key_listing("tensors with NaN or infinite values", non_finite)
        )
    module.load_state_dict(given, strict=True, assign=any(p.is_meta for p in module.parameters()))
