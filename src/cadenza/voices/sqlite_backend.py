"""``SQLiteBackend``: saved voices in one SQLite file (the embedded default), computed features in files beside it.

Layout of ``directory``::

    voices.sqlite3                               voices, pinned features, lexicons, audit log, blocked recordings
    cache/<voice id>/<model key>.safetensors     prompt features a model computed later (``FileFeatureCache``)

Concurrency: one connection per store object, guarded by a lock (SQLite calls are short; audio blobs are a few MB at
most), WAL journal so readers never block the writer, ``busy_timeout`` so several processes sharing the directory
wait for each other's write transactions instead of failing, and ``BEGIN IMMEDIATE`` for writes so two processes
never deadlock upgrading read locks. Deleted rows are overwritten (``secure_delete``) and the write-ahead log is
folded in after a delete, so a removed recording's bytes do not linger in the files.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from cadenza.errors import InputError, UnknownSpeakerError
from cadenza.voices.audit import Run
from cadenza.voices.feature_cache import FileFeatureCache
from cadenza.voices.migrations import migrate_sqlite
from cadenza.voices.sql_backend import SQLBackend

DB_NAME = "voices.sqlite3"
CACHE_DIR = "cache"


class SQLiteBackend(SQLBackend):
    def __init__(self, directory: Path, busy_timeout_s: float = 10.0) -> None:
        self.directory = directory
        self.location = str(directory / DB_NAME)
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # voices are biometric data: owner only
        except OSError as exc:
            raise InputError(f"cannot create the voice directory {directory}: {exc}") from exc
        self.cache = FileFeatureCache(directory / CACHE_DIR)
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(directory / DB_NAME, timeout=busy_timeout_s, isolation_level=None,
                                       check_same_thread=False)
            with self._lock:
                self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
                self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable across app crashes
                # Voices are biometric data: deleted rows are overwritten with zeros, not left in free pages.
                self._db.execute("PRAGMA secure_delete = ON")
                with self._transaction():
                    migrate_sqlite(self._db, self.location)
        except sqlite3.DatabaseError as exc:  # not a database, unreadable, locked past the timeout
            raise InputError(f"cannot open the voice store {self.location}: {exc}") from exc
        self.cache.sweep_temporaries()

    # -- plumbing ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """A write transaction that takes SQLite's write lock up front (no read->write upgrade deadlocks)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _run(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self._db.execute(sql, args).fetchall()

    @contextlib.contextmanager
    def _write(self) -> Iterator[Run]:
        with self._transaction():
            yield self._run

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._run(sql, args)

    def _is_name_conflict(self, exc: Exception) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and "name" in str(exc)

    def _after_delete(self, voice_id: str) -> None:
        self.cache.remove(voice_id)
        self._checkpoint()

    def drop_expired_audio(self, now: float) -> int:
        dropped = super().drop_expired_audio(now)
        if dropped:
            self._checkpoint()
        return dropped

    def _checkpoint(self) -> None:
        """Fold the write-ahead log into the database and empty it, so a removed recording's old pages do not
        linger there (best effort: another process reading right now keeps the log for a moment)."""
        with self._lock, contextlib.suppress(sqlite3.DatabaseError):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- computed features: files ----------------------------------------------------------------------------------
    def _exists(self, voice_id: str) -> bool:
        return bool(self._read("SELECT 1 FROM voices WHERE id = ?", (voice_id,)))

    def cached_features(self, voice_id: str, model_key: str) -> bytes | None:
        data = self.cache.read(voice_id, model_key)
        if data is not None and not self._exists(voice_id):  # a concurrent delete raced a cache write: drop it
            self.cache.remove(voice_id)
            return None
        return data

    def cache_features(self, voice_id: str, model_key: str, data: bytes) -> None:
        self.cache.path(voice_id, model_key)  # validates both before anything else
        if not self._exists(voice_id):
            raise UnknownSpeakerError(f"unknown voice {voice_id!r}")
        self.cache.write(voice_id, model_key, data)
        if not self._exists(voice_id):  # deleted while we wrote: don't leave features of a deleted voice behind
            self.cache.remove(voice_id)

    def drop_cached(self, voice_id: str, model_key: str) -> None:
        self.cache.drop(voice_id, model_key)
