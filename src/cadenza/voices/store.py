"""``VoiceStore``: saved voices in one SQLite file, with a per-model cache of computed prompt features.

Layout of ``directory``::

    voices.sqlite3                               one row per voice: id, name, transcript, consent, times, 16-bit WAV
    cache/<voice id>/<model key>.safetensors     prompt features a model computed from that voice (optional)

Concurrency: one connection per store object, guarded by a lock (SQLite calls are short; audio blobs are a few MB at
most), WAL journal so readers never block the writer, ``busy_timeout`` so several processes sharing the directory
wait for each other's write transactions instead of failing, and ``BEGIN IMMEDIATE`` for writes so two processes
never deadlock upgrading read locks. Cache files are written to a temporary name and renamed into place, so a
reader sees either no file or a whole one.

Security: a voice's *name* never reaches the filesystem. Cache paths are built only from ids this store generated
and re-validated (``voice_`` + 22 URL-safe characters) and from model keys of a strict format.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import secrets
import shutil
import sqlite3
import tempfile
import threading
import time
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from cadenza.errors import InputError, UnknownSpeakerError
from cadenza.voices import audit
from cadenza.voices.validation import (
    DEFAULT_MAX_AUDIO_BYTES,
    ID_PREFIX,
    ID_TOKEN_BYTES,
    PromptInput,
    decode_prompt,
    looks_like_id,
    validate_consent,
    validate_declared_by,
    validate_model_key,
    validate_transcript,
    validate_voice_id,
    validate_voice_name,
    wav_bytes,
)

log = logging.getLogger(__name__)

DB_NAME = "voices.sqlite3"
CACHE_DIR = "cache"
SCHEMA_VERSION = 4
# name_key (schema 2): the name case-folded, so that names differing only in case are one name in every script
# (SQLite's NOCASE folds ASCII only: 'Élodie' and 'élodie' were two voices in schema 1).
# family, cloning (schema 3): the model family the voice was made (and checked) for, and how that family clones it
# (VoxCPM 2: reference / continuation / combined; NULL for CosyVoice 2, where the transcript decides). Voices of
# schemas 1-2 were all made for CosyVoice 2.
# declared_by, audio_sha256, uses, last_used_at (schema 4): the consent record (who declared the right to use the
# voice; the SHA-256 of its recording's 16-bit samples) and use counts; the audit tables (audit.py); retention:
# ``audio`` is an empty blob when the recording is not kept, ``audio_expires_at`` when a kept one is dropped, and
# ``voice_features`` pins the prompt features of the model the voice was made with (written with the voice).
DEFAULT_FAMILY = "cosyvoice2"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS voices (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE COLLATE NOCASE,
    name_key    TEXT UNIQUE,
    transcript  TEXT,
    consent     TEXT NOT NULL,
    consent_at  REAL NOT NULL,
    created_at  REAL NOT NULL,
    sample_rate INTEGER NOT NULL,
    num_samples INTEGER NOT NULL,
    audio       BLOB NOT NULL,
    family      TEXT,
    cloning     TEXT,
    declared_by TEXT,
    audio_sha256 TEXT,
    uses        INTEGER NOT NULL DEFAULT 0,
    last_used_at REAL,
    audio_expires_at REAL
)
"""
_FEATURES_SCHEMA = """
CREATE TABLE IF NOT EXISTS voice_features (
    voice_id  TEXT NOT NULL,
    model_key TEXT NOT NULL,
    data      BLOB NOT NULL,
    PRIMARY KEY (voice_id, model_key)
)
"""
_COLUMNS = (f"id, name, transcript, consent, consent_at, created_at, sample_rate, num_samples, "
            f"COALESCE(family, '{DEFAULT_FAMILY}'), cloning, declared_by, audio_sha256, length(audio) > 0, "
            f"audio_expires_at")
_INSERT_COLUMNS = ("id, name, transcript, consent, consent_at, created_at, sample_rate, num_samples, family, cloning, "
                   "declared_by, audio_sha256, audio_expires_at")
_TMP_PREFIX = ".tmp-"


def name_key(name: str) -> str:
    """What makes two voice names the same name: Unicode NFC, then full case folding (``'Straße'`` = ``'STRASSE'``)."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold())


def _tensor_bytes(tensors: dict[str, torch.Tensor], voice_id: str, model_key: str) -> bytes:
    from safetensors.torch import save

    if not tensors or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()):
        raise InputError("features are a non-empty dict of name -> tensor")
    return save({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()},
                metadata={"voice_id": voice_id, "model_key": model_key})


def audio_hash(pcm16: np.ndarray) -> str:
    """SHA-256 (hex) of a recording's 16-bit samples as stored: the same recording uploaded again (the same file, or
    a lossless copy with the same samples) hashes the same; an edited or lossily re-encoded one does not."""
    return hashlib.sha256(np.ascontiguousarray(pcm16, dtype="<i2").tobytes()).hexdigest()


def stored_samples(wav: torch.Tensor) -> torch.Tensor:
    """``wav`` as the store gives it back (written as 16-bit PCM with 32767 scaling, read by libsndfile as
    int / 32768): features computed from this are the ones a later recomputation from the stored audio gives."""
    return torch.round(wav.clamp(-1.0, 1.0) * 32767.0) / 32768.0


@dataclass(frozen=True)
class VoiceRecord:
    """A saved voice (without its audio; read that with ``VoiceStore.audio``). Times are Unix seconds (UTC)."""

    id: str
    name: str
    transcript: str | None
    consent: str
    consent_at: float
    created_at: float
    sample_rate: int
    num_samples: int
    family: str = DEFAULT_FAMILY  # the model family it was made for (``cadenza.api.model_family`` names)
    cloning: str | None = None  # VoxCPM 2: "reference", "continuation" or "combined"
    declared_by: str | None = None  # who declared the right to use the voice (the consent record)
    audio_sha256: str | None = None  # SHA-256 of the recording's 16-bit samples as stored
    audio_kept: bool = True  # the recording itself is stored (else only the features synthesis needs)
    audio_expires_at: float | None = None  # when a kept recording is dropped (None: kept until the voice is)

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate

    def to_dict(self) -> dict:
        return {**asdict(self), "duration": round(self.duration, 3)}


class VoiceStore:
    """Voices saved under ``directory`` (created if needed; shared safely by threads and processes).

    ``max_audio_bytes`` bounds an encoded upload; ``max_seconds`` bounds the prompt's duration (the frontends read
    at most 30 s). ``busy_timeout_s``: how long a write waits for another process's write to finish.
    """

    def __init__(self, directory: str | os.PathLike, max_audio_bytes: int = DEFAULT_MAX_AUDIO_BYTES,
                 max_seconds: float = 30.0, busy_timeout_s: float = 10.0) -> None:
        self.directory = Path(directory).expanduser()
        self.max_audio_bytes = int(max_audio_bytes)
        self.max_seconds = float(max_seconds)
        if self.max_audio_bytes <= 0 or self.max_seconds <= 0:
            raise ValueError("max_audio_bytes and max_seconds must be positive")
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # voices are biometric data: owner only
        except OSError as exc:
            raise InputError(f"cannot create the voice directory {self.directory}: {exc}") from exc
        self._cache_root = self.directory / CACHE_DIR
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(self.directory / DB_NAME, timeout=busy_timeout_s, isolation_level=None,
                                       check_same_thread=False)
            with self._lock:
                self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
                self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable across app crashes
                # Voices are biometric data: deleted rows are overwritten with zeros, not left in free pages.
                self._db.execute("PRAGMA secure_delete = ON")
                with self._write():
                    self._db.execute(_SCHEMA)
                    version = self._db.execute("PRAGMA user_version").fetchone()[0]
                    if version > SCHEMA_VERSION:
                        raise InputError(f"{self.directory / DB_NAME} was written by a newer Cadenza (schema {version})")
                    if 0 < version < 2:
                        self._add_name_keys()
                    if 0 < version < 3:
                        self._add_family_columns()
                    if 0 < version < 4:
                        self._add_consent_columns()
                    audit.create_tables(self._db)
                    self._db.execute(_FEATURES_SCHEMA)
                    self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                self.drop_expired_audio()
        except sqlite3.DatabaseError as exc:  # not a database, unreadable, locked past the timeout
            raise InputError(f"cannot open the voice store {self.directory / DB_NAME}: {exc}") from exc
        self._sweep_temporaries()

    # -- plumbing ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _write(self):
        """A write transaction that takes SQLite's write lock up front (no read->write upgrade deadlocks)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _sweep_temporaries(self, older_than_s: float = 3600.0) -> None:
        """Remove cache files a killed writer left half-written (``.tmp-*``; never read). Only old ones: another
        process sharing the directory may be writing a fresh one right now."""
        cutoff = time.time() - older_than_s
        for path in self._cache_root.glob(f"*/{_TMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()

    def _add_name_keys(self) -> None:
        """Schema 1 -> 2: fill ``name_key``. Old names that fold to the same key keep working by their exact name
        (the later ones get no key) and are logged, since they can no longer both be looked up case-insensitively."""
        columns = [row[1] for row in self._db.execute("PRAGMA table_info(voices)")]
        if "name_key" not in columns:
            self._db.execute("ALTER TABLE voices ADD COLUMN name_key TEXT")
            self._db.execute("CREATE UNIQUE INDEX IF NOT EXISTS voices_name_key ON voices (name_key)")
        seen: set[str] = set()
        for voice_id, name in self._db.execute("SELECT id, name FROM voices ORDER BY created_at, id").fetchall():
            key = name_key(name)
            if key in seen:
                log.warning("voice %s: its name %r differs from an older voice's only in case", voice_id, name)
                continue
            seen.add(key)
            self._db.execute("UPDATE voices SET name_key = ? WHERE id = ?", (key, voice_id))

    def _add_family_columns(self) -> None:
        """Schema 2 -> 3: the family columns (NULL reads as CosyVoice 2, which every older voice was made for)."""
        columns = [row[1] for row in self._db.execute("PRAGMA table_info(voices)")]
        for column in ("family", "cloning"):
            if column not in columns:
                self._db.execute(f"ALTER TABLE voices ADD COLUMN {column} TEXT")

    def _add_consent_columns(self) -> None:
        """Schema 3 -> 4: the consent record's columns; the hash of every kept recording is computed now."""
        columns = [row[1] for row in self._db.execute("PRAGMA table_info(voices)")]
        for column, kind in (("declared_by", "TEXT"), ("audio_sha256", "TEXT"),
                             ("uses", "INTEGER NOT NULL DEFAULT 0"), ("last_used_at", "REAL"),
                             ("audio_expires_at", "REAL")):
            if column not in columns:
                self._db.execute(f"ALTER TABLE voices ADD COLUMN {column} {kind}")
        for voice_id, blob in self._db.execute("SELECT id, audio FROM voices WHERE audio_sha256 IS NULL").fetchall():
            if blob:
                samples, _ = sf.read(io.BytesIO(blob), dtype="int16")
                self._db.execute("UPDATE voices SET audio_sha256 = ? WHERE id = ?", (audio_hash(samples), voice_id))

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> VoiceStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- voices --------------------------------------------------------------------------------------------------
    def check_new(self, name: str, transcript: str | None, consent: str) -> tuple[str, str | None, str]:
        """Validated (name, transcript, consent) for a new voice; ``InputError`` if any is invalid or the name is
        taken (``add`` checks again inside its transaction: this is the early, cheap answer)."""
        name = validate_voice_name(name)
        transcript = validate_transcript(transcript)
        consent = validate_consent(consent)
        if self._query("SELECT 1 FROM voices WHERE name_key = ? OR name = ?", (name_key(name), name)):
            raise self._taken(name)
        return name, transcript, consent

    @staticmethod
    def _taken(name: str) -> InputError:
        return InputError(f"a voice named {name!r} already exists (names are case-insensitive)")

    def add(self, name: str, audio: PromptInput, transcript: str | None, consent: str,
            family: str = DEFAULT_FAMILY, cloning: str | None = None, declared_by: str | None = None,
            keep_audio: bool = True, audio_ttl_s: float | None = None,
            features: dict[str, dict[str, torch.Tensor]] | None = None) -> VoiceRecord:
        """Validate and save a voice (one transaction). ``audio``: encoded file bytes (any format libsndfile reads)
        or ``(samples, sample_rate)``; ``family``/``cloning``: the model family it is for and how that family uses
        it (checked by the family's ``PromptLibrary``); ``declared_by``: who declares the right to use the voice (the
        consent record keeps it with the statement, the time and the recording's hash). Raises ``InputError`` (bad
        name, name taken, no consent, a recording that was taken down) or ``AudioError``. The creation is logged
        (``audit_log``).

        Retention: ``keep_audio=False`` stores only ``features`` (``{model key: tensors}``: what synthesis needs, pinned
        with the voice in the same transaction), not the recording; ``audio_ttl_s`` keeps the recording that long
        (then ``drop_expired_audio`` removes it). Without a kept recording a voice works only with models whose
        features it holds."""
        name, transcript, consent = self.check_new(name, transcript, consent)
        declared_by = validate_declared_by(declared_by)
        if not keep_audio and not features:
            raise InputError("a voice saved without its recording needs the features synthesis uses (features=...)")
        if audio_ttl_s is not None and not (isinstance(audio_ttl_s, (int, float)) and audio_ttl_s > 0):
            raise InputError(f"audio_ttl_s must be a positive number of seconds, got {audio_ttl_s!r}")
        if not isinstance(family, str) or not family.isidentifier() or len(family) > 32:
            raise InputError(f"bad model family name {str(family)[:40]!r}")
        wav, sr = decode_prompt(audio, self.max_audio_bytes, max_seconds=self.max_seconds)
        blob = wav_bytes(wav, sr) if keep_audio else b""
        digest = audio_hash(np.round(np.clip(wav.numpy(), -1.0, 1.0) * 32767.0).astype(np.int16))
        now = time.time()
        voice_id = ID_PREFIX + secrets.token_urlsafe(ID_TOKEN_BYTES)
        expires = now + audio_ttl_s if keep_audio and audio_ttl_s is not None else None
        record = VoiceRecord(voice_id, name, transcript, consent, now, now, sr, int(wav.numel()), family, cloning,
                             declared_by, digest, keep_audio, expires)
        pinned = [(key, _tensor_bytes(t, voice_id, key)) for key, t in (features or {}).items()]
        try:
            with self._write():
                if audit.blocked(self._db, digest):
                    audit.record(self._db, "blocked_attempt", None, name=name, audio_sha256=digest)
                    blocked = True
                else:
                    blocked = False
                    self._db.execute(
                        f"INSERT INTO voices ({_INSERT_COLUMNS}, name_key, audio) VALUES ({', '.join('?' * 15)})",
                        (record.id, name, transcript, consent, now, now, sr, record.num_samples, family, cloning,
                         declared_by, digest, expires, name_key(name), blob),
                    )
                    for key, data in pinned:
                        self._db.execute("INSERT INTO voice_features (voice_id, model_key, data) VALUES (?, ?, ?)",
                                         (record.id, validate_model_key(key), data))
                    audit.record(self._db, "created", record.id, name=name, family=family, declared_by=declared_by,
                                 audio_sha256=digest)
        except sqlite3.IntegrityError as exc:
            if "name" in str(exc):
                raise self._taken(name) from exc
            raise
        if blocked:
            raise InputError("this recording was taken down by the operator and cannot be saved as a voice again")
        return record

    def list(self) -> list[VoiceRecord]:
        """All voices, oldest first."""
        return [VoiceRecord(*row) for row in self._query(f"SELECT {_COLUMNS} FROM voices ORDER BY created_at, id")]

    def get(self, id_or_name: str) -> VoiceRecord:
        """A voice by id, or else by name (case-insensitive). Raises ``UnknownSpeakerError``."""
        if not isinstance(id_or_name, str):
            raise UnknownSpeakerError(f"a voice is named by a string, not {type(id_or_name).__name__}")
        try:
            id_or_name.encode("utf-8")
        except UnicodeEncodeError:  # not text any name or id can be (e.g. a lone surrogate from JSON)
            raise UnknownSpeakerError(f"unknown voice {id_or_name[:80]!r}: not valid Unicode text") from None
        if looks_like_id(id_or_name):
            rows = self._query(f"SELECT {_COLUMNS} FROM voices WHERE id = ?", (id_or_name,))
        else:
            rows = (self._query(f"SELECT {_COLUMNS} FROM voices WHERE name_key = ?", (name_key(id_or_name),))
                    or self._query(f"SELECT {_COLUMNS} FROM voices WHERE name = ?",  # schema-1 duplicates, by exact name
                                   (unicodedata.normalize("NFC", id_or_name),)))
        if not rows:
            raise UnknownSpeakerError(f"unknown voice {id_or_name[:80]!r}")
        return VoiceRecord(*rows[0])

    def __contains__(self, id_or_name: str) -> bool:
        try:
            self.get(id_or_name)
        except UnknownSpeakerError:
            return False
        return True

    def delete(self, voice_id: str) -> None:
        """Delete a voice and its cached features. Raises ``UnknownSpeakerError`` if there is none with that id."""
        self._delete(voice_id, "deleted")

    def _delete(self, voice_id: str, event: str, reason: str | None = None) -> dict:
        validate_voice_id(voice_id)
        with self._write():
            row = self._db.execute("SELECT name, audio_sha256, uses FROM voices WHERE id = ?", (voice_id,)).fetchone()
            if row is None:
                raise UnknownSpeakerError(f"unknown voice {voice_id!r}")
            name, digest, uses = row
            self._db.execute("DELETE FROM voices WHERE id = ?", (voice_id,))
            self._db.execute("DELETE FROM voice_features WHERE voice_id = ?", (voice_id,))
            detail = {"name": name, "audio_sha256": digest, "uses": uses}
            if event == "takedown":
                detail["reason"] = reason
                if digest is not None:
                    audit.block(self._db, digest, reason or "takedown")
            audit.record(self._db, event, voice_id, **detail)
        self._remove_cache(voice_id)
        self._checkpoint()
        return detail

    def _checkpoint(self) -> None:
        """Fold the write-ahead log into the database and empty it, so a removed recording's old pages do not
        linger there (best effort: another process reading right now keeps the log for a moment)."""
        with self._lock, contextlib.suppress(sqlite3.DatabaseError):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def takedown(self, id_or_name: str, reason: str) -> dict:
        """An operator's takedown: delete the voice and its cached features, and refuse its recording from now on
        (``add`` raises for the same samples). ``reason`` is logged. Returns what was removed."""
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 1000:
            raise InputError("a takedown needs a reason (1-1000 characters): it is kept in the audit log")
        record = self.get(id_or_name)
        return {"id": record.id, **self._delete(record.id, "takedown", reason.strip())}

    def record_use(self, voice_id: str) -> None:
        """Count one synthesis with the voice (the audit log's use counts); drop recordings past their time."""
        with self._write():
            self._db.execute("UPDATE voices SET uses = uses + 1, last_used_at = ? WHERE id = ?",
                             (time.time(), voice_id))
            self._drop_expired()

    def drop_expired_audio(self) -> int:
        """Remove kept recordings whose time is up (their voices keep working from their pinned features).
        Returns how many were dropped."""
        with self._write():
            dropped = self._drop_expired()
        if dropped:
            self._checkpoint()
        return dropped

    def _drop_expired(self) -> int:
        expired = self._db.execute("SELECT id, name FROM voices WHERE audio_expires_at <= ? AND length(audio) > 0",
                                   (time.time(),)).fetchall()
        for voice_id, name in expired:
            self._db.execute("UPDATE voices SET audio = x'', audio_expires_at = NULL WHERE id = ?", (voice_id,))
            audit.record(self._db, "audio_expired", voice_id, name=name)
        return len(expired)

    def consent_record(self, id_or_name: str) -> dict:
        """The voice's consent record, for export: the declaration, who made it and when, the recording's hash,
        the family it was made for, its use count."""
        record = self.get(id_or_name)
        uses, last = self._query("SELECT uses, last_used_at FROM voices WHERE id = ?", (record.id,))[0]
        return {"voice_id": record.id, "name": record.name, "declaration": record.consent,
                "declared_by": record.declared_by, "declared_at": record.consent_at,
                "audio_sha256": record.audio_sha256, "family": record.family, "created_at": record.created_at,
                "uses": uses, "last_used_at": last}

    def audit_log(self, voice_id: str | None = None, limit: int = 1000) -> list[audit.AuditEvent]:
        """Events (created, deleted, takedown, blocked_attempt) of one voice or all, oldest first."""
        with self._lock:
            return audit.events(self._db, voice_id, limit)

    def audio(self, voice_id: str) -> tuple[np.ndarray, int]:
        """The stored prompt: float32 mono samples in [-1, 1] and their sample rate."""
        validate_voice_id(voice_id)
        rows = self._query("SELECT audio FROM voices WHERE id = ?", (voice_id,))
        if not rows:
            raise UnknownSpeakerError(f"unknown voice {voice_id!r}")
        if not rows[0][0]:
            raise InputError(f"voice {voice_id!r} keeps no recording, only the features of the model it was made "
                             "with: create it again to use it with other model files")
        samples, sr = sf.read(io.BytesIO(rows[0][0]), dtype="float32")
        return samples, int(sr)

    # -- prompt feature cache ------------------------------------------------------------------------------------
    def _cache_path(self, voice_id: str, model_key: str) -> Path:
        return self._cache_root / validate_voice_id(voice_id) / f"{validate_model_key(model_key)}.safetensors"

    def _remove_cache(self, voice_id: str) -> None:
        shutil.rmtree(self._cache_root / validate_voice_id(voice_id), ignore_errors=True)

    def _exists(self, voice_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM voices WHERE id = ?", (voice_id,)))

    def cached_prompt(self, voice_id: str, model_key: str) -> dict[str, torch.Tensor] | None:
        """Features pinned with the voice (``add(features=...)``) or saved by ``cache_prompt`` for this voice and
        model, or ``None`` (not cached, voice deleted, or the file is unreadable, in which case it is removed)."""
        from safetensors.torch import load as load_bytes

        pinned = self._query("SELECT data FROM voice_features WHERE voice_id = ? AND model_key = ?",
                             (validate_voice_id(voice_id), validate_model_key(model_key)))
        if pinned:
            return load_bytes(pinned[0][0])
        path = self._cache_path(voice_id, model_key)
        if not path.is_file():
            return None
        if not self._exists(voice_id):  # a concurrent delete raced a cache write: drop the orphan
            self._remove_cache(voice_id)
            return None
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(path)
        except (SafetensorError, OSError, ValueError) as exc:
            log.warning("dropping unreadable prompt cache %s: %s", path, exc)
            path.unlink(missing_ok=True)
            return None

    def cache_prompt(self, voice_id: str, model_key: str, tensors: dict[str, torch.Tensor]) -> None:
        """Save computed prompt features (safetensors; written atomically). Raises ``UnknownSpeakerError`` if the
        voice does not exist."""
        from safetensors.torch import save_file

        path = self._cache_path(voice_id, model_key)
        if not self._exists(voice_id):
            raise UnknownSpeakerError(f"unknown voice {voice_id!r}")
        if not tensors or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()):
            raise InputError("cache_prompt needs a non-empty dict of name -> tensor")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TMP_PREFIX, suffix=".safetensors")
        os.close(fd)
        try:
            save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, tmp,  # own storage each
                      metadata={"voice_id": voice_id, "model_key": model_key})
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        if not self._exists(voice_id):  # deleted while we wrote: don't leave features of a deleted voice behind
            self._remove_cache(voice_id)
