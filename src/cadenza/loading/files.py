"""Checks and readers for the small files of a model folder (configs, metadata), hostile input included.

Every failure is a ``CheckpointError`` that names the file and what is wrong with it: missing, a directory, a
broken link, empty, too large for what it claims to be, not UTF-8, not JSON, too deeply nested.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cadenza.errors import CheckpointError

# Model configs are a few KiB (the release's cosyvoice2.yaml is 7 KiB); the cap keeps a hostile or mistaken
# multi-GiB file from being read into memory and parsed.
MAX_CONFIG_BYTES = 1 << 20


def check_file(path: str | Path, what: str | None = None) -> Path:
    """``path`` if it is a readable, non-empty regular file (links followed); else ``CheckpointError``."""
    path = Path(path)
    name = what or path.name
    if path.is_symlink() and not path.exists():
        raise CheckpointError(f"{name}: {path} is a link to a file that does not exist")
    if not path.exists():
        raise CheckpointError(f"{name} not found: {path}")
    if path.is_dir():
        raise CheckpointError(f"{name}: {path} is a directory, not a file")
    if not path.is_file():
        raise CheckpointError(f"{name}: {path} is not a regular file")
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CheckpointError(f"{name}: cannot read {path}: {exc}") from exc
    if size == 0:
        raise CheckpointError(f"{name}: {path} is empty (0 bytes)")
    return path


def read_text(path: str | Path, what: str | None = None, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of a small file, checked with ``check_file`` and capped at ``max_bytes``."""
    path = check_file(path, what)
    name = what or path.name
    size = path.stat().st_size
    if size > max_bytes:
        raise CheckpointError(f"{name}: {path} is {size:,} bytes; a config file is at most {max_bytes:,}")
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise CheckpointError(f"{name}: cannot read {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{name}: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def read_json_object(path: str | Path, what: str | None = None, max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A JSON file holding an object (``dict``)."""
    path = Path(path)
    name = what or path.name
    text = read_text(path, what, max_bytes)
    try:
        doc = json.loads(text)
    except RecursionError as exc:  # json's decoder recurses per nesting level
        raise CheckpointError(f"{name}: {path} is nested too deeply to be a config") from exc
    except ValueError as exc:
        raise CheckpointError(f"{name}: {path} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CheckpointError(f"{name}: {path} must hold a JSON object, found {type(doc).__name__}")
    return doc
