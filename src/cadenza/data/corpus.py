"""Corpus readers: LJSpeech, LibriTTS and JSONL manifests -> ``CorpusItem`` lists (audio path + transcript).

Layouts:

* ``ljspeech``: ``DIR/metadata.csv`` with ``id|raw text|normalized text`` lines (normalized text preferred), audio
  in ``DIR/wavs/<id>.wav``; one speaker (``LJ``), English.
* ``libritts``: ``.../<speaker>/<chapter>/<utt>.wav`` with ``<utt>.normalized.txt`` (else ``<utt>.original.txt``)
  next to it, anywhere below DIR (a subset folder or the whole corpus); English.
* ``jsonl``: a file (or ``DIR/manifest.jsonl``) with one object per line: ``audio`` (path, relative to the file's
  folder unless absolute; ``audio_path``/``wav`` also accepted), ``text``, optional ``speaker``, ``language``, ``id``.

Readers never raise for one bad entry: a malformed line or a missing transcript becomes a ``Rejection``. Items are
returned sorted by id, so shard contents (and therefore ``--resume``) do not depend on directory listing order.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from cadenza.errors import InputError

LAYOUTS = ("ljspeech", "libritts", "jsonl")


@dataclass(frozen=True)
class CorpusItem:
    id: str
    audio: Path
    text: str
    speaker: str = ""
    language: str = ""


@dataclass(frozen=True)
class Rejection:
    id: str
    reason: str
    audio: str = ""
    category: str = "corpus"  # malformed manifest entry, missing transcript, duplicate id

    def to_json(self) -> dict:
        return {"id": self.id, "audio": self.audio, "category": self.category, "reason": self.reason}


def read_corpus(path: str | Path, layout: str) -> tuple[list[CorpusItem], list[Rejection]]:
    """All items of the corpus at ``path`` (sorted by id, ids unique) and the entries that could not be read."""
    path = Path(path).expanduser()
    if layout not in LAYOUTS:
        raise InputError(f"unknown corpus layout {layout!r}; choose one of {LAYOUTS}")
    if not path.exists():
        raise InputError(f"corpus not found: {path}")
    items, rejected = {"ljspeech": _ljspeech, "libritts": _libritts, "jsonl": _jsonl}[layout](path)
    unique: dict[str, CorpusItem] = {}
    for item in items:
        if item.id in unique:
            rejected.append(Rejection(item.id, "duplicate id (the first occurrence is kept)", str(item.audio)))
        else:
            unique[item.id] = item
    return [unique[k] for k in sorted(unique)], rejected


def _ljspeech(root: Path) -> tuple[list[CorpusItem], list[Rejection]]:
    meta = root / "metadata.csv" if root.is_dir() else root
    if not meta.is_file():
        raise InputError(f"LJSpeech layout needs {meta} (id|text|normalized text)")
    wavs = meta.parent / "wavs"
    items, rejected = [], []
    with meta.open(encoding="utf-8", newline="") as f:
        for lineno, row in enumerate(csv.reader(f, delimiter="|", quoting=csv.QUOTE_NONE), start=1):
            if not row or not row[0].strip():
                continue
            uid = row[0].strip()
            if len(row) < 2:
                rejected.append(Rejection(uid, f"metadata.csv line {lineno}: no transcript column"))
                continue
            text = (row[2] if len(row) > 2 and row[2].strip() else row[1]).strip()
            items.append(CorpusItem(uid, wavs / f"{uid}.wav", text, "LJ", "en"))
    return items, rejected


def _libritts(root: Path) -> tuple[list[CorpusItem], list[Rejection]]:
    if not root.is_dir():
        raise InputError(f"LibriTTS layout needs a folder of <speaker>/<chapter>/*.wav, got {root}")
    items, rejected = [], []
    for wav in sorted(root.rglob("*.wav")):
        uid = wav.stem
        parts = wav.relative_to(root).parts
        speaker = parts[-3] if len(parts) >= 3 else (uid.split("_")[0] if "_" in uid else "")
        text_file = next((p for p in (wav.with_suffix(".normalized.txt"), wav.with_suffix(".original.txt")) if p.is_file()),
                         None)
        if text_file is None:
            rejected.append(Rejection(uid, "missing transcript (.normalized.txt / .original.txt)", str(wav)))
            continue
        try:
            text = text_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            rejected.append(Rejection(uid, f"unreadable transcript {text_file.name}: {exc}", str(wav)))
            continue
        items.append(CorpusItem(uid, wav, text, speaker, "en"))
    return items, rejected


def _jsonl(path: Path) -> tuple[list[CorpusItem], list[Rejection]]:
    manifest = path / "manifest.jsonl" if path.is_dir() else path
    if not manifest.is_file():
        raise InputError(f"JSONL layout needs a manifest file, got {manifest}")
    items, rejected = [], []
    for lineno, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        fallback_id = f"{manifest.stem}-{lineno:06d}"
        try:
            entry = json.loads(line)
        except ValueError as exc:
            rejected.append(Rejection(fallback_id, f"line {lineno} is not JSON: {exc}"))
            continue
        if not isinstance(entry, dict):
            rejected.append(Rejection(fallback_id, f"line {lineno} is not a JSON object"))
            continue
        uid = str(entry.get("id") or fallback_id)
        audio = entry.get("audio") or entry.get("audio_path") or entry.get("wav")
        text = entry.get("text")
        if not isinstance(audio, str) or not audio:
            rejected.append(Rejection(uid, f"line {lineno}: no 'audio' path"))
            continue
        if not isinstance(text, str):
            rejected.append(Rejection(uid, f"line {lineno}: no 'text' string", audio))
            continue
        audio_path = Path(audio).expanduser()
        if not audio_path.is_absolute():
            audio_path = manifest.parent / audio_path
        items.append(CorpusItem(uid, audio_path, text.strip(), str(entry.get("speaker") or ""),
                                str(entry.get("language") or "")))
    return items, rejected
