"""Corpus readers: LJSpeech, LibriTTS and JSONL manifests -> ``CorpusItem`` lists (audio path + transcript).

Layouts:

* ``ljspeech``: ``DIR/metadata.csv`` with ``id|raw text|normalized text`` lines (normalized text preferred), audio
  in ``DIR/wavs/<id>.wav``; one speaker (``LJ``), English.
* ``libritts``: ``.../<speaker>/<chapter>/<utt>.wav`` (or ``.flac``) with ``<utt>.normalized.txt`` (else ``<utt>.original.txt``)
  next to it, anywhere below DIR (a subset folder or the whole corpus); English.
* ``jsonl``: a file (or ``DIR/manifest.jsonl``) with one object per line: ``audio`` (path, relative to the file's
  folder unless absolute; ``audio_path``/``wav`` also accepted), ``text``, optional ``speaker``, ``language``, ``id``.

Readers never raise for one bad entry: a malformed line, a missing transcript, a string that is not valid Unicode
(a lone surrogate from a JSON ``\\ud800`` escape or an undecodable file name) or holds a NUL, an LJSpeech id that is
not a plain file name, or a duplicate id becomes a ``Rejection``. A manifest that is not UTF-8 text, or a corpus with
no usable item at all (an empty file, a CSV given as JSONL), is an ``InputError`` naming the file: preparing it
would only write an empty dataset. Items are returned sorted by id, so shard contents (and therefore ``--resume``)
do not depend on directory listing order.
"""

from __future__ import annotations

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
    if not unique:
        if not rejected:
            raise InputError(f"the {layout} corpus {path} is empty: no entries")
        raise InputError(f"the {layout} corpus {path} has no usable item: all {len(rejected)} entries were rejected "
                         f"(the first: {rejected[0].reason})")
    return [unique[k] for k in sorted(unique)], rejected


def printable(value: str) -> str:
    """``value`` with anything UTF-8 cannot encode (lone surrogates) written as ``\\udXXX`` escapes."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _bad_string(value: str) -> str | None:
    """Why ``value`` cannot be stored (a lone surrogate or a NUL), else None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode (a lone surrogate U+{ord(value[exc.start]):04X} at character {exc.start})"
    if "\x00" in value:
        return f"contains a NUL character at character {value.index(chr(0))}"
    return None


def _check_fields(uid: str, where: str, audio: str, **fields: str) -> Rejection | None:
    for name, value in (("id", uid), ("audio", audio), *fields.items()):
        reason = _bad_string(value)
        if reason:
            return Rejection(printable(uid), f"{where}: {name} {reason}", printable(audio))
    return None


def _lines(text: str) -> list[str]:
    """Lines split at ``\\n`` only (``str.splitlines`` would also split at U+2028 inside a JSON string)."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def _read_manifest(path: Path, what: str) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the {what} {path}: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"the {what} {path} is not UTF-8 text (line {line}, byte {exc.start}: {exc.reason}); "
                         "convert it with iconv or save it as UTF-8") from exc


def _ljspeech(root: Path) -> tuple[list[CorpusItem], list[Rejection]]:
    meta = root / "metadata.csv" if root.is_dir() else root
    if not meta.is_file():
        raise InputError(f"LJSpeech layout needs {meta} (id|text|normalized text)")
    wavs = meta.parent / "wavs"
    items, rejected = [], []
    # id|raw|normalized with no quoting (LJSpeech's own csv.QUOTE_NONE): a plain split, without csv's field limit.
    for lineno, line in enumerate(_lines(_read_manifest(meta, "LJSpeech metadata")), start=1):
        row = line.split("|")
        if not row[0].strip():
            continue
        uid = row[0].strip()
        where = f"metadata.csv line {lineno}"
        if len(row) < 2:
            rejected.append(Rejection(printable(uid), f"{where}: no transcript column"))
            continue
        text = (row[2] if len(row) > 2 and row[2].strip() else row[1]).strip()
        bad = _check_fields(uid, where, "", text=text)
        if bad is None and (uid in (".", "..") or any(c in uid for c in "/\\")):
            bad = Rejection(uid, f"{where}: id {uid[:80]!r} is not a plain file name (wavs/<id>.wav)")
        if bad is not None:
            rejected.append(bad)
            continue
        items.append(CorpusItem(uid, wavs / f"{uid}.wav", text, "LJ", "en"))
    return items, rejected


LIBRITTS_AUDIO = (".wav", ".flac")  # LibriTTS ships WAV; LibriSpeech-style trees converted to it keep FLAC


def _libritts(root: Path) -> tuple[list[CorpusItem], list[Rejection]]:
    if not root.is_dir():
        raise InputError(f"LibriTTS layout needs a folder of <speaker>/<chapter>/*.wav, got {root}")
    items, rejected = [], []
    for wav in sorted(p for p in root.rglob("*") if p.suffix.lower() in LIBRITTS_AUDIO and p.is_file()):
        uid = wav.stem
        parts = wav.relative_to(root).parts
        speaker = parts[-3] if len(parts) >= 3 else (uid.split("_")[0] if "_" in uid else "")
        text_file = next((p for p in (wav.with_suffix(".normalized.txt"), wav.with_suffix(".original.txt")) if p.is_file()),
                         None)
        bad = _check_fields(uid, "file name", str(wav), speaker=speaker)
        if bad is not None:
            rejected.append(bad)
            continue
        if text_file is None:
            rejected.append(Rejection(uid, "missing transcript (.normalized.txt / .original.txt)", str(wav)))
            continue
        try:
            text = text_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            rejected.append(Rejection(uid, f"unreadable transcript {text_file.name}: {exc}", str(wav)))
            continue
        bad = _check_fields(uid, text_file.name, str(wav), text=text)
        if bad is not None:
            rejected.append(bad)
            continue
        items.append(CorpusItem(uid, wav, text, speaker, "en"))
    return items, rejected


def _jsonl(path: Path) -> tuple[list[CorpusItem], list[Rejection]]:
    manifest = path / "manifest.jsonl" if path.is_dir() else path
    if not manifest.is_file():
        raise InputError(f"JSONL layout needs a manifest file, got {manifest}")
    items, rejected = [], []
    for lineno, line in enumerate(_lines(_read_manifest(manifest, "JSONL manifest")), start=1):
        if not line.strip():
            continue
        fallback_id = printable(f"{manifest.stem}-{lineno:06d}")
        try:
            entry = json.loads(line)
        except RecursionError:
            rejected.append(Rejection(fallback_id, f"line {lineno} is nested too deeply to be a manifest entry"))
            continue
        except ValueError as exc:
            rejected.append(Rejection(fallback_id, f"line {lineno} is not JSON: {exc}"))
            continue
        if not isinstance(entry, dict):
            rejected.append(Rejection(fallback_id, f"line {lineno} is not a JSON object"))
            continue
        raw_id = entry.get("id")
        if raw_id is not None and (isinstance(raw_id, bool) or not isinstance(raw_id, (str, int))):
            rejected.append(Rejection(fallback_id, f"line {lineno}: 'id' must be a string or an integer, not "
                                                   f"{type(raw_id).__name__}"))
            continue
        uid = str(raw_id if raw_id not in (None, "") else fallback_id)
        audio = entry.get("audio") or entry.get("audio_path") or entry.get("wav")
        text = entry.get("text")
        if not isinstance(audio, str) or not audio:
            rejected.append(Rejection(printable(uid), f"line {lineno}: no 'audio' path"))
            continue
        if not isinstance(text, str):
            rejected.append(Rejection(printable(uid), f"line {lineno}: no 'text' string", printable(audio)))
            continue
        speaker, language = entry.get("speaker") or "", entry.get("language") or ""
        if not isinstance(speaker, (str, int)) or not isinstance(language, str):
            rejected.append(Rejection(printable(uid), f"line {lineno}: 'speaker' and 'language' must be strings",
                                      printable(audio)))
            continue
        bad = _check_fields(uid, f"line {lineno}", audio, text=text, speaker=str(speaker), language=language)
        if bad is not None:
            rejected.append(bad)
            continue
        audio_path = Path(audio).expanduser()
        if not audio_path.is_absolute():
            audio_path = manifest.parent / audio_path
        items.append(CorpusItem(uid, audio_path, text.strip(), str(speaker), language))
    return items, rejected
