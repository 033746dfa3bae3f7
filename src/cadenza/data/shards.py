"""On-disk layout of a prepared corpus: safetensors shards + JSONL index (no pickle anywhere).

::

    DATA/
      prepare.json                      corpus fingerprint, settings and counts
      index.jsonl                       one line per accepted item: id, shard, key, text, speaker, language,
                                        audio (source path), seconds, fields
      rejected.jsonl                    one line per rejected item: id, audio, reason
      shards/shard_00000.safetensors    tensors named "<key>/<field>" (key = item number inside the shard)
      shards/shard_00000.done.json      written last: the shard's index entries and rejections (= "finished")
      shards/shard_00000.<name>.safetensors + .<name>.done.json
                                        features added later by extractor <name> (``add_features``)

A shard counts as finished only when its ``.done.json`` exists; the tensors file is renamed into place before it,
so an interrupted run leaves at most an orphaned temporary file and ``--resume`` redoes just that shard.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from cadenza.errors import InputError

SHARD_DIR = "shards"
INDEX_FILE = "index.jsonl"
REJECTED_FILE = "rejected.jsonl"
SUMMARY_FILE = "prepare.json"


def shard_stem(k: int) -> str:
    return f"shard_{k:05d}"


def tensor_file(data_dir: Path, k: int, extractor: str | None = None) -> Path:
    suffix = f".{extractor}" if extractor else ""
    return Path(data_dir) / SHARD_DIR / f"{shard_stem(k)}{suffix}.safetensors"


def done_file(data_dir: Path, k: int, extractor: str | None = None) -> Path:
    suffix = f".{extractor}" if extractor else ""
    return Path(data_dir) / SHARD_DIR / f"{shard_stem(k)}{suffix}.done.json"


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[dict]:
    """The objects of a JSONL file; ``InputError`` naming the file and line when one is not a JSON object."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    rows = []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{path}:{n} is not JSON ({str(exc)[:100]}): the folder is damaged") from exc
        if not isinstance(row, dict):
            raise InputError(f"{path}:{n} is not a JSON object: the folder is damaged")
        rows.append(row)
    return rows


def read_done(data_dir: Path, k: int, extractor: str | None = None) -> dict | None:
    """The finished-shard record, or None if the shard is not finished (or its record is unreadable)."""
    path = done_file(data_dir, k, extractor)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _as_tensor(value: Any) -> torch.Tensor:
    t = value.detach().cpu() if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
    if t.dtype == torch.float64:
        t = t.float()
    elif t.dtype == torch.int64:
        t = t.int()
    return t.contiguous().clone()


class ShardWriter:
    """Collects one shard in memory, then writes its tensors and its ``.done.json`` record."""

    def __init__(self, data_dir: Path, k: int, extractor: str | None = None) -> None:
        self.data_dir, self.k, self.extractor = Path(data_dir), k, extractor
        self.tensors: dict[str, torch.Tensor] = {}
        self.entries: list[dict] = []
        self.rejected: list[dict] = []

    def add(self, key: str, arrays: dict[str, Any], entry: dict | None = None) -> None:
        """Add one item; all or nothing (``ValueError`` when a value is not a numeric array)."""
        converted = {}
        for name, value in arrays.items():
            try:
                t = _as_tensor(value)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise ValueError(f"field {name!r} is not a numeric array ({type(value).__name__}: {exc})") from exc
            converted[f"{key}/{name}"] = t
        self.tensors.update(converted)
        if entry is not None:
            self.entries.append({**entry, "shard": self.k, "key": key, "fields": sorted(arrays)})

    def reject(self, record: dict) -> None:
        self.rejected.append(record)

    def finish(self, extra: dict | None = None) -> dict:
        path = tensor_file(self.data_dir, self.k, self.extractor)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            save_file(self.tensors, tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        record = {"shard": self.k, "entries": self.entries, "rejected": self.rejected, **(extra or {})}
        atomic_write_text(done_file(self.data_dir, self.k, self.extractor), json.dumps(record, ensure_ascii=False))
        return record


def write_prepared(data_dir: str | Path, records: list[tuple[dict, dict[str, Any]]], shard_size: int = 256) -> None:
    """Write a prepared corpus from ``(entry, arrays)`` pairs (entry: ``id``, ``text`` and optional ``speaker``,
    ``language``, ``seconds``; arrays: field -> array) — for programmatic or synthetic data; no validation."""
    data_dir = Path(data_dir)
    index: list[dict] = []
    for k in range((len(records) + shard_size - 1) // shard_size):
        writer = ShardWriter(data_dir, k)
        for i, (entry, arrays) in enumerate(records[k * shard_size : (k + 1) * shard_size]):
            full = {"speaker": "", "language": "", "audio": "", "seconds": 0.0, **entry}
            writer.add(f"{i:05d}", arrays, full)
        index += writer.finish()["entries"]
    write_jsonl(data_dir / INDEX_FILE, index)
    write_jsonl(data_dir / REJECTED_FILE, [])
