"""Training checkpoints: ``OUT/checkpoints/step_N.pt`` (N = optimiser steps done), written atomically.

A checkpoint is plain data (tensors, numbers, strings, lists, dicts) saved with ``torch.save`` and read back with
``weights_only=True``: ``{"format", "stage", "step", "world_size", "train", "state", "rng"}`` where ``state`` is the
stage's ``state_dict()`` and ``rng`` the global RNG states of every rank. Writes go to a temporary file in the same
folder and are renamed into place, so a crash never leaves a truncated ``step_N.pt`` behind.
"""

from __future__ import annotations

import os
import pickle
import re
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from cadenza.errors import CheckpointError

CHECKPOINT_DIR = "checkpoints"
FORMAT = 1
_NAME = re.compile(r"^step_(\d+)\.pt$")


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / CHECKPOINT_DIR


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return checkpoint_dir(out_dir) / f"step_{step}.pt"


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every checkpoint, oldest first."""
    folder = checkpoint_dir(out_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name)) and p.is_file()]
    return sorted(found)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path`` via a temporary file + rename (atomic on POSIX)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(out_dir: str | Path, step: int, payload: dict[str, Any], keep: int = 0) -> Path:
    """Write ``payload`` (plus ``format`` and ``step``) as ``step_{step}.pt``; keep the newest ``keep`` (0 = all)."""
    path = checkpoint_path(out_dir, step)
    atomic_torch_save({"format": FORMAT, **payload, "step": int(step)}, path)
    if keep > 0:
        for _, old in list_checkpoints(out_dir)[:-keep]:
            old.unlink(missing_ok=True)
    return path


def _load_failure(path: Path, exc: BaseException) -> CheckpointError:
    """A short, specific reason (torch's own messages run to a page and suggest ``weights_only=False``)."""
    text = str(exc)
    if isinstance(exc, OSError):
        return CheckpointError(f"cannot read training checkpoint {path}: {exc.strerror or exc}")
    if isinstance(exc, EOFError) or (path.is_file() and path.stat().st_size == 0):
        return CheckpointError(f"training checkpoint {path} is empty (an interrupted copy?)")
    unsafe = " and unpickling them could run code"
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return CheckpointError(f"refused to load training checkpoint {path}: it refers to the Python object "
                               f"{found.group(1)}, not just tensors and plain data,{unsafe}")
    if isinstance(exc, pickle.UnpicklingError) and "invalid load key" not in text:
        detail = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
        return CheckpointError(f"refused to load training checkpoint {path}: it holds more than tensors and plain "
                               f"data ({detail.group(1).strip() if detail else 'an unsupported pickle'}),{unsafe}")
    if (isinstance(exc, (zipfile.BadZipFile, pickle.UnpicklingError)) or "zip archive" in text
            or "central directory" in text or "legacy .tar format" in text):
        return CheckpointError(f"training checkpoint {path} is truncated or corrupt (not a complete torch archive)")
    first = text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__
    return CheckpointError(f"cannot read training checkpoint {path} (corrupt or not a checkpoint): {first}")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by ``save_checkpoint`` (``weights_only``: a file that would run code is refused)."""
    path = Path(path)
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before it refuses a file
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile, EOFError, ValueError, OSError, TypeError,
            AttributeError, ImportError, IndexError, KeyError, MemoryError) as exc:
        raise _load_failure(path, exc) from exc
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or "state" not in obj or "step" not in obj:
        raise CheckpointError(f"{path} is not a cadenza training checkpoint (format {FORMAT})")
    step = obj["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{path}: 'step' must be an integer >= 0, got {str(step)[:80]!r}")
    return obj
