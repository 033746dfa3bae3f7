"""The voice database's schema and how a database of an older schema is brought up to it, for both backends.

Schema versions are shared: both backends hold schema ``SCHEMA_VERSION`` (the PostgreSQL backend begins at 4). A
database written by a newer Cadenza is refused (``SchemaTooNewError``), never downgraded or half-read.

* SQLite keeps its version in ``PRAGMA user_version`` (what every older Cadenza reads to refuse a newer file).
  History: 1 voices; 2 ``name_key`` (full Unicode case folding); 3 ``family``/``cloning``; 4 the consent record,
  use counts, retention, pinned features and the audit tables; 5 ``voice_lexicons`` (a voice's pronunciation
  lexicon, removed with its voice by a trigger).
* PostgreSQL keeps a ``schema_version`` table (one row per applied step, with its time) and runs every pending step
  in one transaction under an advisory lock, so replicas starting together on an empty database migrate it once.
  History: 4 everything SQLite's schema 4 holds, plus ``prompt_cache``; 5 ``voice_lexicons`` (``ON DELETE CASCADE``).

Schema 5's ``voice_lexicons`` is created with ``IF NOT EXISTS`` on both: for a few hours before it was part of the
schema, Cadenza created the same table lazily on a schema-4 database (with the first lexicon saved); such a table,
and its rows, are kept as they are.

A new version adds a step to both: ``migrate_sqlite`` and ``POSTGRES_STEPS``.
"""

from __future__ import annotations

import io
import logging
import sqlite3
import time

import soundfile as sf

from cadenza.errors import InputError
from cadenza.voices import audit
from cadenza.voices.records import audio_hash, name_key

log = logging.getLogger(__name__)

SCHEMA_VERSION = 5


class SchemaTooNewError(InputError):
    """The database was written by a newer Cadenza (a schema this one does not know)."""

    def __init__(self, where: str, version: int) -> None:
        super().__init__(f"the voice database {where} has schema {version}, newer than this Cadenza's "
                         f"{SCHEMA_VERSION}: upgrade Cadenza (pip install -U cadenza) on every replica using it")


# -- SQLite ------------------------------------------------------------------------------------------------------
_SQLITE_VOICES = """
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
_SQLITE_FEATURES = """
CREATE TABLE IF NOT EXISTS voice_features (
    voice_id  TEXT NOT NULL,
    model_key TEXT NOT NULL,
    data      BLOB NOT NULL,
    PRIMARY KEY (voice_id, model_key)
)
"""
# SQLite connections here do not enforce foreign keys (turning that on would change how every older table behaves):
# a trigger removes a voice's lexicon in the transaction that deletes the voice.
_SQLITE_LEXICONS = (
    """CREATE TABLE IF NOT EXISTS voice_lexicons (
        voice_id   TEXT PRIMARY KEY,
        entries    TEXT NOT NULL,
        updated_at REAL NOT NULL
    )""",
    """CREATE TRIGGER IF NOT EXISTS voice_lexicons_follow_voice AFTER DELETE ON voices
    BEGIN DELETE FROM voice_lexicons WHERE voice_id = OLD.id; END""",
)


def migrate_sqlite(db: sqlite3.Connection, where: str) -> None:
    """Create or upgrade the schema (inside the caller's write transaction)."""
    db.execute(_SQLITE_VOICES)
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise SchemaTooNewError(where, version)
    if 0 < version < 2:
        _sqlite_name_keys(db)
    if 0 < version < 3:
        _sqlite_family_columns(db)
    if 0 < version < 4:
        _sqlite_consent_columns(db)
    for statement in audit.SQLITE_SCHEMA:
        db.execute(statement)
    db.execute(_SQLITE_FEATURES)
    for statement in _SQLITE_LEXICONS:  # 4 -> 5 (IF NOT EXISTS: see the module's docstring)
        db.execute(statement)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _columns(db: sqlite3.Connection) -> list[str]:
    return [row[1] for row in db.execute("PRAGMA table_info(voices)")]


def _sqlite_name_keys(db: sqlite3.Connection) -> None:
    """1 -> 2: fill ``name_key``. Old names that fold to the same key keep working by their exact name (the later
    ones get no key) and are logged, since they can no longer both be looked up case-insensitively."""
    if "name_key" not in _columns(db):
        db.execute("ALTER TABLE voices ADD COLUMN name_key TEXT")
        db.execute("CREATE UNIQUE INDEX IF NOT EXISTS voices_name_key ON voices (name_key)")
    seen: set[str] = set()
    for voice_id, name in db.execute("SELECT id, name FROM voices ORDER BY created_at, id").fetchall():
        key = name_key(name)
        if key in seen:
            log.warning("voice %s: its name %r differs from an older voice's only in case", voice_id, name)
            continue
        seen.add(key)
        db.execute("UPDATE voices SET name_key = ? WHERE id = ?", (key, voice_id))


def _sqlite_family_columns(db: sqlite3.Connection) -> None:
    """2 -> 3: the family columns (NULL reads as CosyVoice 2, which every older voice was made for)."""
    columns = _columns(db)
    for column in ("family", "cloning"):
        if column not in columns:
            db.execute(f"ALTER TABLE voices ADD COLUMN {column} TEXT")


def _sqlite_consent_columns(db: sqlite3.Connection) -> None:
    """3 -> 4: the consent record's columns; the hash of every kept recording is computed now."""
    columns = _columns(db)
    for column, kind in (("declared_by", "TEXT"), ("audio_sha256", "TEXT"), ("uses", "INTEGER NOT NULL DEFAULT 0"),
                         ("last_used_at", "REAL"), ("audio_expires_at", "REAL")):
        if column not in columns:
            db.execute(f"ALTER TABLE voices ADD COLUMN {column} {kind}")
    for voice_id, blob in db.execute("SELECT id, audio FROM voices WHERE audio_sha256 IS NULL").fetchall():
        if blob:
            samples, _ = sf.read(io.BytesIO(blob), dtype="int16")
            db.execute("UPDATE voices SET audio_sha256 = ? WHERE id = ?", (audio_hash(samples), voice_id))


# -- PostgreSQL --------------------------------------------------------------------------------------------------
# Schema 4 as SQLite has it, plus ``prompt_cache``: the features replicas compute later (SQLite keeps those in files
# beside the database; replicas on several machines share no folder). Feature rows belong to their voice (ON DELETE
# CASCADE): a cache write racing a delete fails instead of leaving features of a deleted voice behind.
_POSTGRES_4 = (
    """CREATE TABLE voices (
        id               text PRIMARY KEY,
        name             text NOT NULL,
        name_key         text NOT NULL UNIQUE,
        transcript       text,
        consent          text NOT NULL,
        consent_at       double precision NOT NULL,
        created_at       double precision NOT NULL,
        sample_rate      integer NOT NULL,
        num_samples      integer NOT NULL,
        audio            bytea NOT NULL,
        family           text,
        cloning          text,
        declared_by      text,
        audio_sha256     text,
        uses             bigint NOT NULL DEFAULT 0,
        last_used_at     double precision,
        audio_expires_at double precision
    )""",
    """CREATE TABLE voice_features (
        voice_id  text NOT NULL REFERENCES voices (id) ON DELETE CASCADE,
        model_key text NOT NULL,
        data      bytea NOT NULL,
        PRIMARY KEY (voice_id, model_key)
    )""",
    """CREATE TABLE prompt_cache (
        voice_id  text NOT NULL REFERENCES voices (id) ON DELETE CASCADE,
        model_key text NOT NULL,
        data      bytea NOT NULL,
        PRIMARY KEY (voice_id, model_key)
    )""",
    *audit.POSTGRES_SCHEMA,
)
# IF NOT EXISTS: a schema-4 database may hold this table already, made with the first lexicon saved (see above).
_POSTGRES_5 = (
    """CREATE TABLE IF NOT EXISTS voice_lexicons (
        voice_id   text PRIMARY KEY REFERENCES voices (id) ON DELETE CASCADE,
        entries    text NOT NULL,
        updated_at double precision NOT NULL
    )""",
)
POSTGRES_STEPS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (4, "voices, pinned features, prompt cache, audit log, blocked recordings", _POSTGRES_4),
    (5, "voice pronunciation lexicons", _POSTGRES_5),
)
_MIGRATION_LOCK = 0x6361_6465_6E7A_61  # pg_advisory_xact_lock key ("cadenza")


def postgres_version(conn) -> int:
    """The schema a PostgreSQL database holds (0: none yet)."""
    if conn.execute("SELECT to_regclass('schema_version')").fetchone()[0] is None:
        return 0
    return int(conn.execute("SELECT COALESCE(max(version), 0) FROM schema_version").fetchone()[0])


def migrate_postgres(conn, where: str, target: int = SCHEMA_VERSION) -> int:
    """Apply the pending steps up to ``target`` (one transaction); returns the version found before. ``conn``: a
    psycopg connection in autocommit mode."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))  # concurrent starts: one migrates
        found = postgres_version(conn)
        if found > SCHEMA_VERSION:
            raise SchemaTooNewError(where, found)
        if found == 0:
            conn.execute("CREATE TABLE schema_version (version integer PRIMARY KEY, "
                         "applied_at double precision NOT NULL, description text NOT NULL)")
        for version, description, statements in POSTGRES_STEPS:
            if found < version <= target:
                for statement in statements:
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version (version, applied_at, description) VALUES (%s, %s, %s)",
                             (version, time.time(), description))
                log.info("voice database %s: schema %d applied (%s)", where, version, description)
    return found
