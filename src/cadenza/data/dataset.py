"""``ShardDataset``: a map-style dataset over a prepared corpus (``index.jsonl`` + safetensors shards).

``ShardDataset(DATA, fields=("mel", "speech_tokens"))`` keeps the items that have every requested field (in the
main shard or a sidecar) and returns, per item, a dict with the index metadata (``index``, ``id``, ``text``,
``speaker``, ``language``, ``seconds``) and the requested fields as CPU tensors (``wav`` converted to float32 in
[-1, 1]). Shard files are memory-mapped lazily per process, so the dataset is cheap to pickle into DataLoader
workers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch.utils.data import Dataset

from cadenza.data.extractors import PCM_SCALE
from cadenza.data.shards import INDEX_FILE, SHARD_DIR, read_jsonl, shard_stem
from cadenza.errors import InputError

log = logging.getLogger(__name__)


def _shard_files(data_dir: Path, k: int) -> list[Path]:
    """The main tensor file of shard k and every finished sidecar."""
    folder = data_dir / SHARD_DIR
    stem = shard_stem(k)
    files = [folder / f"{stem}.safetensors"]
    for done in sorted(folder.glob(f"{stem}.*.done.json")):
        name = done.name[len(stem) + 1 : -len(".done.json")]
        if (folder / f"{stem}.{name}.safetensors").is_file():
            files.append(folder / f"{stem}.{name}.safetensors")
    return files


class ShardDataset(Dataset):
    def __init__(self, data_dir: str | Path, fields: Sequence[str], optional: Sequence[str] = ()) -> None:
        self.data_dir = Path(data_dir)
        index = self.data_dir / INDEX_FILE
        if not index.is_file():
            raise InputError(f"{self.data_dir} is not a prepared corpus (no {INDEX_FILE}); "
                             "run `cadenza data prepare --corpus ... --out DIR` first")
        self.fields, self.optional = tuple(fields), tuple(optional)
        entries = read_jsonl(index)
        for n, e in enumerate(entries, 1):
            if not (isinstance(e.get("shard"), int) and e["shard"] >= 0 and isinstance(e.get("key"), str)
                    and isinstance(e.get("id"), str)):
                raise InputError(f"{index}:{n} lacks an integer 'shard' and string 'key' and 'id': the corpus "
                                 "folder is damaged")
        # field -> file for every (shard, key): read once from the safetensors headers
        self._where: dict[tuple[int, str], dict[str, Path]] = {}
        self._shapes: dict[tuple[int, str], dict[str, tuple[int, ...]]] = {}
        for k in sorted({e["shard"] for e in entries}):
            for path in _shard_files(self.data_dir, k):
                if not path.is_file():
                    raise InputError(f"missing shard file {path}: the corpus folder is incomplete")
                try:
                    with safe_open(str(path), framework="pt") as f:
                        for name in f.keys():
                            key, _, field = name.partition("/")
                            self._where.setdefault((k, key), {})[field] = path
                            self._shapes.setdefault((k, key), {})[field] = tuple(f.get_slice(name).get_shape())
                except (OSError, SafetensorError) as exc:
                    raise InputError(f"shard file {path} is unreadable ({exc}): truncated or damaged; prepare the "
                                     "corpus again") from exc
        self.entries = [e for e in entries if all(f in self._where.get((int(e["shard"]), e["key"]), {}) for f in fields)]
        dropped = len(entries) - len(self.entries)
        if not self.entries:
            stored = set().union(*self._where.values()) if self._where else set()
            missing = [f for f in fields if f not in stored]
            hint = ("the waveform is stored unless `cadenza data prepare` ran with --no-wav: prepare again without it"
                    if missing == ["wav"] else
                    "prepare with --model or add them with `cadenza data extract`")
            raise InputError(f"no item of {self.data_dir} has all of the fields {list(fields)}"
                             f"{f' (none has {missing})' if missing else ''}; {hint}")
        if dropped:
            log.warning("%s: %d of %d items lack one of %s and are skipped", self.data_dir, dropped, len(entries),
                        list(fields))
        self._handles: dict[Path, Any] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        """Shapes of every stored field of item ``i`` (from the file headers, without reading data)."""
        e = self.entries[i]
        return self._shapes[(int(e["shard"]), e["key"])]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_handles"] = {}  # safetensors handles do not cross process boundaries
        return state

    def _tensor(self, path: Path, name: str) -> torch.Tensor:
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = safe_open(str(path), framework="pt")
        return handle.get_tensor(name)

    def field(self, i: int, name: str) -> torch.Tensor:
        """Item ``i``'s stored field ``name`` alone, as stored (``KeyError`` if the item lacks it)."""
        e = self.entries[i]
        return self._tensor(self._where[(int(e["shard"]), e["key"])][name], f"{e['key']}/{name}")

    def __getitem__(self, i: int) -> dict[str, Any]:
        e = self.entries[i]
        where = self._where[(int(e["shard"]), e["key"])]
        item: dict[str, Any] = {"index": i, "id": e["id"], "text": e.get("text", ""), "speaker": e.get("speaker", ""),
                                "language": e.get("language", ""), "seconds": e.get("seconds", 0.0)}
        for field in self.fields + tuple(f for f in self.optional if f in where):
            t = self._tensor(where[field], f"{e['key']}/{field}")
            item[field] = t.float() / PCM_SCALE if field == "wav" else t
        return item
