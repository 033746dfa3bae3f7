"""VoxCPM 2 fine-tuning data: the manifest, checked clips and their AudioVAE latents, cached once per clip.

See docs/training.md, "Fine-tuning VoxCPM 2".

Manifest (the reference trainer's format; one JSON object per line)::

    {"audio": "wavs/0001.wav", "text": "transcript", "ref_audio": "wavs/voice.wav", "dataset_id": 0, "id": "0001"}

``audio`` and ``text`` are required; ``ref_audio`` (a reference clip of the same voice, packed in front: docs/design.md,
"VoxCPM 2 training"), ``dataset_id`` (>= 0, for the per-dataset bookkeeping), ``is_prompt`` (no loss on the clip) and
``id`` are optional. Relative paths are relative to the manifest's folder. ``--data`` is that folder (holding
``manifest.jsonl``) or the ``.jsonl`` file itself.

Latents: every clip (target and reference) is decoded at the AudioVAE's rate, checked (readable, within
``[min_seconds, max_seconds]``, not silent: ``cadenza.data.validate``), encoded once and stored as
``CACHE/<vae key>/<clip sha256>.safetensors`` (``patches [k, P, D]`` float32, the clip's seconds in the metadata).
The key is the VAE file's SHA-256 and the patch size, so another VAE never reads stale latents and a clip used
twice (a shared reference) is encoded once. A rejected clip leaves ``<clip sha256>.rejected.json`` with the reason and
the limits it was checked against (checked again when the limits change). Under torchrun every rank encodes its share
of the clips, then all read the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from cadenza.data.validate import DataLimits, ItemRejected, check_speaking_rate, check_text, load_checked_audio
from cadenza.errors import InputError
from cadenza.training.wav_manifest import manifest_rows

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.jsonl"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ManifestEntry:
    id: str
    audio: Path
    text: str
    ref_audio: Path | None = None
    dataset_id: int = 0
    is_prompt: bool = False


def manifest_path(data: str | Path, name: str = MANIFEST_NAME) -> Path:
    """``data`` itself when it is a file, else ``data/name``."""
    d = Path(data).expanduser()
    return d if d.is_file() else d / name


def read_manifest(path: str | Path) -> list[ManifestEntry]:
    """Entries of a manifest file; ``InputError`` names the line of the first malformed one."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"VoxCPM 2 training manifest not found: {path} (one JSON object per line with 'audio' and "
                         "'text', optionally 'ref_audio')")
    base = path.parent

    def resolve(value: str) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else base / p

    entries = []
    for n, row in manifest_rows(path, "each line needs 'audio' (a path) and 'text' (the transcript)", text=True):
        ref, dataset_id, is_prompt = row.get("ref_audio"), row.get("dataset_id", 0), row.get("is_prompt", False)
        if ref is not None and not isinstance(ref, str):
            raise InputError(f"{path}:{n}: 'ref_audio' must be a path")
        if isinstance(dataset_id, bool) or not isinstance(dataset_id, int) or dataset_id < 0:
            raise InputError(f"{path}:{n}: 'dataset_id' must be an integer >= 0, got {dataset_id!r}")
        if not isinstance(is_prompt, bool):
            raise InputError(f"{path}:{n}: 'is_prompt' must be true or false")
        entries.append(ManifestEntry(str(row.get("id", n)), resolve(row["audio"]), row["text"],
                                     resolve(ref) if ref else None, dataset_id, is_prompt))
    if not entries:
        raise InputError(f"{path} lists no clips")
    return entries


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _atomic(path: Path, write: Callable[[str], None]) -> None:
    """``write(tmp)`` then rename into place: concurrent writers of the same clip never leave half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class LatentCache:
    """``<root>/<vae sha256[:16]>-p<patch size>/``: one safetensors file per clip content."""

    def __init__(self, root: str | Path, vae_file: Path, patch_size: int) -> None:
        self.dir = Path(root).expanduser() / f"{file_sha256(vae_file)[:16]}-p{patch_size}"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create the latent cache {self.dir}: {exc.strerror or exc} (set "
                             "voxcpm2.cache_dir to a writable folder)") from exc
        self._keys: dict[Path, str] = {}

    def key(self, audio: Path) -> str:
        if audio not in self._keys:
            try:
                self._keys[audio] = file_sha256(audio)
            except OSError:
                self._keys[audio] = "unreadable-" + hashlib.sha256(str(audio).encode()).hexdigest()
        return self._keys[audio]

    def latents(self, audio: Path) -> Path:
        return self.dir / f"{self.key(audio)}.safetensors"

    def rejection(self, audio: Path) -> Path:
        return self.dir / f"{self.key(audio)}.rejected.json"

    def status(self, audio: Path, limits: DataLimits) -> tuple[dict[str, Any] | None, str | None]:
        """``({"seconds", "patches"}, None)`` for a usable cached clip, ``(None, reason)`` for a rejected one,
        ``(None, None)`` when the clip has not been checked under these limits."""
        if self.latents(audio).is_file():
            meta = json.loads(self._metadata(self.latents(audio)))
            seconds = float(meta["seconds"])
            if seconds < limits.min_seconds:
                return None, f"too short: {seconds:.2f} s < {limits.min_seconds:g} s"
            if seconds > limits.max_seconds:
                return None, f"too long: {seconds:.2f} s > {limits.max_seconds:g} s"
            return meta, None
        marker = self.rejection(audio)
        if marker.is_file():
            note = json.loads(marker.read_text(encoding="utf-8"))
            if note.get("limits") == [limits.min_seconds, limits.max_seconds]:
                return None, str(note["reason"])
        return None, None

    @staticmethod
    def _metadata(path: Path) -> str:
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            return (f.metadata() or {})["clip"]

    def extract(self, audio: Path, limits: DataLimits, encode: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Check and encode one clip into the cache (or leave its rejection marker)."""
        try:
            wav = load_checked_audio(audio, limits)
        except ItemRejected as exc:
            note = {"reason": str(exc), "category": exc.category, "limits": [limits.min_seconds, limits.max_seconds]}
            _atomic(self.rejection(audio), lambda tmp: Path(tmp).write_text(json.dumps(note), encoding="utf-8"))
            return
        patches = encode(wav).contiguous()
        meta = {"clip": json.dumps({"seconds": wav.numel() / limits.sample_rate, "patches": int(patches.shape[0]),
                                    "source": str(audio)})}
        _atomic(self.latents(audio), lambda tmp: save_file({"patches": patches}, tmp, metadata=meta))
        self.rejection(audio).unlink(missing_ok=True)

    def load(self, audio: Path) -> torch.Tensor:
        """``[k, P, D]`` float32."""
        return load_file(str(self.latents(audio)))["patches"]


@dataclass(frozen=True)
class ClipItem:
    entry: ManifestEntry
    text_ids: tuple[int, ...]
    length: int  # packed sequence length


class VoxCPM2Items(torch.utils.data.Dataset):
    """``[i] -> {"index", "text_ids", "patches" [A, P, D], "ref_patches" [R, P, D] or None, "is_prompt",
    "dataset_id"}`` read from the latent cache."""

    def __init__(self, items: list[ClipItem], cache: LatentCache) -> None:
        self.items, self.cache = items, cache

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        it = self.items[i]
        e = it.entry
        return {"index": i, "text_ids": list(it.text_ids), "patches": self.cache.load(e.audio),
                "ref_patches": self.cache.load(e.ref_audio) if e.ref_audio is not None else None,
                "is_prompt": e.is_prompt, "dataset_id": e.dataset_id}


def select_items(entries: list[ManifestEntry], cache: LatentCache, limits: DataLimits,
                 tokenize: Callable[[str], list[int]], vocab_size: int, max_length: int
                 ) -> tuple[list[ClipItem], dict[str, str]]:
    """The usable entries (clips cached and within limits, transcript speakable and tokenisable, packed length
    <= ``max_length``: a truncated sample would lose its stop label) and ``{id: reason}`` for the others."""
    kept, rejected = [], {}
    for e in entries:
        try:
            text = check_text(e.text)
            meta, reason = cache.status(e.audio, limits)
            if reason or meta is None:
                raise ItemRejected(reason or "clip not extracted", "audio")
            check_speaking_rate(text, float(meta["seconds"]), limits)
            ref_patches = 0
            if e.ref_audio is not None:
                ref_meta, reason = cache.status(e.ref_audio, limits)
                if reason or ref_meta is None:
                    raise ItemRejected(f"reference: {reason or 'clip not extracted'}", "audio")
                ref_patches = int(ref_meta["patches"])
            ids = tokenize(text)
            if not ids or max(ids) >= vocab_size or min(ids) < 0:
                raise ItemRejected(f"the transcript gives no text ids or ids outside the vocabulary ({vocab_size})",
                                   "text")
            length = len(ids) + int(meta["patches"]) + 2 + (ref_patches + 2 if ref_patches else 0)
            if length > max_length:
                raise ItemRejected(f"packed sequence of {length} positions > max_length {max_length}", "too_long")
            kept.append(ClipItem(e, tuple(ids), length))
        except (ItemRejected, InputError) as exc:  # InputError: the tokenizer refused the text
            rejected[e.id] = str(exc)
    return kept, rejected


def clips_of(entries: list[ManifestEntry]) -> list[Path]:
    """Every distinct clip (targets and references) in manifest order."""
    seen: dict[Path, None] = {}
    for e in entries:
        seen[e.audio] = None
        if e.ref_audio is not None:
            seen[e.ref_audio] = None
    return list(seen)
