"""``load(path)``: any supported model folder -> its API object (``Cadenza`` or ``VoxCPM2``), by the files in it."""

from __future__ import annotations

import os
from pathlib import Path

from cadenza.api.arguments import check_device
from cadenza.api.cosyvoice2 import Cadenza
from cadenza.builtin import resolve_model_path
from cadenza.errors import CheckpointError, InputError
from cadenza.models.cosyvoice2.loader import inspect_directory, is_cosyvoice2_dir


def model_family(path: str | os.PathLike) -> str:
    """``"cosyvoice2"`` or ``"voxcpm2"``, from the files in the directory."""
    from cadenza.models.voxcpm2.loader import is_voxcpm2_dir

    directory = Path(path).expanduser()
    try:
        if not directory.is_dir():
            raise CheckpointError(f"model directory not found: {str(directory)[:200]}")
        if is_cosyvoice2_dir(directory):
            return "cosyvoice2"
        if is_voxcpm2_dir(directory):
            return "voxcpm2"
    except OSError as exc:  # a path the OS refuses outright (name too long, no permission)
        raise CheckpointError(f"cannot open model directory {str(directory)[:200]!r}: {exc.strerror or exc}") from exc
    inspect_directory(directory)  # raises, listing what a CosyVoice 2 directory lacks
    raise CheckpointError(f"{directory} is neither a CosyVoice 2 nor a VoxCPM 2 model directory")


def load(path: str | os.PathLike | None = None, **kwargs):
    """Load any supported model directory: a ``Cadenza`` (CosyVoice 2) or a ``VoxCPM2``; ``None``: the built-in
    cadenza-tiny."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise InputError(f"the model path must be a string or a path, not {type(path).__name__}")
    if "device" in kwargs:
        check_device(kwargs["device"])
    path = resolve_model_path(path)
    if model_family(path) == "voxcpm2":
        from cadenza.api.voxcpm2 import VoxCPM2

        kwargs.pop("voices_dir", None)
        return VoxCPM2.from_pretrained(path, **kwargs)
    return Cadenza.from_pretrained(path, **kwargs)
