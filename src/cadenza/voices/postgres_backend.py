"""``PostgresBackend``: saved voices in a PostgreSQL database that several server replicas share (psycopg 3, the
``postgres`` extra). Chosen by a ``postgresql://`` URL (``cadenza serve --voices-db``).

Everything lives in the database, computed features too (``prompt_cache``): replicas on several machines share no
folder, and a delete on one replica removes a voice for all of them at once. Nothing about voices is cached in the
process between calls, so every replica sees the others' writes and deletes as soon as they commit.

Concurrency: one connection per store object, guarded by a lock; writes are single transactions at PostgreSQL's
default READ COMMITTED level, where the unique index on ``name_key`` makes exactly one of two writers creating the
same name win (the other waits for it to commit, then gets ``NameTakenError``). ``lock_timeout`` and
``statement_timeout`` bound how long a call may wait. A connection that breaks (the server restarted, a proxy
closed it) is replaced on the next call; a read that finds its idle connection dead is retried once on a new one.
A failure to reach the database is ``VoiceStoreUnavailableError`` (the server answers 503).

Deleting: rows are removed with ``DELETE`` (features and lexicons by ``ON DELETE CASCADE`` as well). PostgreSQL
has no ``secure_delete``: the old row versions stay in the table's files until ``VACUUM`` marks the space reusable
and later writes overwrite it, and in WAL segments, replicas and backups until those are recycled (docs/server.md).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator

from cadenza.errors import InputError, MissingDependencyError, UnknownSpeakerError
from cadenza.voices.audit import Run
from cadenza.voices.backend import VoiceStoreUnavailableError
from cadenza.voices.migrations import migrate_postgres
from cadenza.voices.sql_backend import SQLBackend

log = logging.getLogger(__name__)

URL_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(location: object) -> bool:
    return isinstance(location, str) and location.startswith(URL_SCHEMES)


_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)([^@\s]+)@")


def _scrubbed(message: str, url: str) -> str:
    """``message`` (libpq's, which may quote the URL) without the URL's password."""
    found = _URL_PASSWORD.search(url)
    if found:
        message = message.replace(found.group(2), "***")
    return _URL_PASSWORD.sub(r"\1***@", message)


def _sql(statement: str) -> str:
    """``?`` placeholders -> psycopg's ``%s`` (the shared SQL has no other ``?`` or ``%``)."""
    return statement.replace("?", "%s")


class PostgresBackend(SQLBackend):
    def __init__(self, url: str, timeout_s: float = 10.0, migrate: bool = True) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise MissingDependencyError("a PostgreSQL voice store needs psycopg 3: pip install 'cadenza[postgres]'"
                                         ) from exc
        self._psycopg = psycopg
        self._url = url
        self._timeout_ms = max(1, int(timeout_s * 1000))
        try:
            info = psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise InputError(f"bad voice database URL: {_scrubbed(str(exc), url)}") from None
        # For messages: never the password.
        self.location = (f"postgresql://{info.get('host') or 'localhost'}:{info.get('port') or 5432}/"
                         f"{info.get('dbname') or info.get('user') or ''}")
        self._lock = threading.RLock()
        self._db = None
        with self._lock:
            try:
                self._connect()
            except psycopg.Error as exc:
                raise InputError(f"cannot open the voice store {self.location}: {self._message(exc)}") from None
            if migrate:
                try:
                    migrate_postgres(self._db, self.location)
                except BaseException as exc:
                    self._db.close()
                    if isinstance(exc, psycopg.Error):  # e.g. a role that may not create the tables
                        raise InputError(f"cannot set up the voice database {self.location}: "
                                         f"{self._message(exc)}") from None
                    raise

    # -- plumbing ------------------------------------------------------------------------------------------------
    def _connect(self):
        self._db = self._psycopg.connect(self._url, autocommit=True, connect_timeout=max(1, self._timeout_ms // 1000),
                                         application_name="cadenza")
        self._db.execute(f"SET lock_timeout = {self._timeout_ms}")
        self._db.execute(f"SET statement_timeout = {self._timeout_ms * 3}")  # a write of a 20 MB voice, with room
        return self._db

    def _connection(self):
        """The connection, replaced first if it broke (called with the lock held)."""
        if self._db is None or self._db.closed or self._db.broken:
            if self._db is not None:
                log.warning("voice database %s: connection lost, reconnecting", self.location)
                with contextlib.suppress(Exception):
                    self._db.close()
            try:
                self._connect()
            except self._psycopg.OperationalError as exc:
                raise VoiceStoreUnavailableError(f"the voice database {self.location} cannot be reached: "
                                                 f"{self._message(exc)}") from None
        return self._db

    def _message(self, exc: Exception) -> str:
        return _scrubbed(str(exc).strip(), self._url)[:300]

    def _unavailable(self, exc: Exception) -> VoiceStoreUnavailableError:
        return VoiceStoreUnavailableError(f"the voice database {self.location} failed: {self._message(exc)}")

    def _run_on(self, conn, sql: str, args: tuple) -> list[tuple]:
        cursor = conn.execute(_sql(sql), args)
        return cursor.fetchall() if cursor.description is not None else []

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            for attempt in (0, 1):
                conn = self._connection()
                try:
                    return self._run_on(conn, sql, args)
                except self._psycopg.OperationalError as exc:
                    if attempt == 0 and conn.broken:  # an idle connection the server dropped: once more, anew
                        continue
                    raise self._unavailable(exc) from None
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _write(self) -> Iterator[Run]:
        with self._lock:
            conn = self._connection()
            try:
                with conn.transaction():
                    yield lambda sql, args=(): self._run_on(conn, sql, args)
            except self._psycopg.OperationalError as exc:  # never retried: the commit may have happened
                raise self._unavailable(exc) from None

    def _is_name_conflict(self, exc: Exception) -> bool:
        errors = self._psycopg.errors
        return isinstance(exc, errors.UniqueViolation) and "name" in (exc.diag.constraint_name or "")

    def _is_missing_voice(self, exc: Exception) -> bool:
        return isinstance(exc, self._psycopg.errors.ForeignKeyViolation)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()

    # -- computed features: the prompt_cache table ---------------------------------------------------------------
    def _delete_cached(self, run: Run, voice_id: str) -> None:
        run("DELETE FROM prompt_cache WHERE voice_id = ?", (voice_id,))

    def cached_features(self, voice_id: str, model_key: str) -> bytes | None:
        rows = self._read("SELECT data FROM prompt_cache WHERE voice_id = ? AND model_key = ?", (voice_id, model_key))
        return bytes(rows[0][0]) if rows else None

    def cache_features(self, voice_id: str, model_key: str, data: bytes) -> None:
        try:
            with self._write() as run:
                run("INSERT INTO prompt_cache (voice_id, model_key, data) VALUES (?, ?, ?) "
                    "ON CONFLICT (voice_id, model_key) DO UPDATE SET data = excluded.data", (voice_id, model_key, data))
        except self._psycopg.errors.ForeignKeyViolation:  # no such voice, or deleted meanwhile
            raise UnknownSpeakerError(f"unknown voice {voice_id!r}") from None

    def drop_cached(self, voice_id: str, model_key: str) -> None:
        with self._write() as run:
            run("DELETE FROM prompt_cache WHERE voice_id = ? AND model_key = ?", (voice_id, model_key))
