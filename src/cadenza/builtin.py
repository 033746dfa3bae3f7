"""The model shipped inside the package (cadenza-tiny) and how a missing ``--model`` resolves to it.

cadenza-tiny is a small CosyVoice-2-architecture model trained by ``recipes/tiny`` (see docs/cadenza-tiny.md); its
folder has the same layout as a released CosyVoice 2 directory plus ``cadenza.json`` (name, default speaker, the
voice table). Any model folder may carry a ``cadenza.json``; only ``default_speaker`` is read at synthesis time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cadenza.errors import CheckpointError

BUILTIN_NAME = "cadenza-tiny"
METADATA_NAME = "cadenza.json"


def builtin_model_dir() -> Path:
    """The packaged cadenza-tiny folder (raises if this install lacks it, e.g. a source tree without the assets)."""
    path = Path(__file__).resolve().parent / "assets" / BUILTIN_NAME
    if not (path / "llm.pt").is_file():
        raise CheckpointError(f"the built-in model is missing from this install ({path}); reinstall cadenza or pass "
                              "a model directory")
    return path


def resolve_model_path(path: str | os.PathLike | None) -> Path:
    """``None`` or ``"cadenza-tiny"`` -> the built-in model; anything else -> that directory (``~`` expanded).

    A real folder named ``cadenza-tiny`` in the working directory wins over the built-in name."""
    if path is None or (str(path) == BUILTIN_NAME and not Path(path).is_dir()):
        return builtin_model_dir()
    return Path(path).expanduser()


def read_model_metadata(directory: Path) -> dict:
    """``cadenza.json`` of a model folder, or ``{}`` when absent."""
    path = Path(directory) / METADATA_NAME
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return doc
