"""The voice store's audit trail: an append-only log of what happened to voices, and the recordings taken down.

Both live in the store's SQLite file, written in the same transaction as the change they record, so the log and
the voices never disagree. The log cannot be edited through SQL (triggers refuse UPDATE and DELETE); it records
events, not text content: the name and family of a voice, who declared the right to use it, the hash of its
recording, its use count when deleted -- never what was synthesised with it.

``blocked_audio`` holds the SHA-256 of recordings an operator took down: the store refuses to save the same
recording again (the same decoded samples; a re-encoded or edited copy hashes differently, see docs/provenance.md).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS audit (
        seq      INTEGER PRIMARY KEY AUTOINCREMENT,
        at       REAL NOT NULL,
        event    TEXT NOT NULL,
        voice_id TEXT,
        detail   TEXT NOT NULL
    )""",
    """CREATE TRIGGER IF NOT EXISTS audit_append_only_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS audit_append_only_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END""",
    """CREATE TABLE IF NOT EXISTS blocked_audio (
        sha256   TEXT PRIMARY KEY,
        at       REAL NOT NULL,
        reason   TEXT NOT NULL
    )""",
)
EVENTS = ("created", "deleted", "takedown", "blocked_attempt", "audio_expired")


@dataclass(frozen=True)
class AuditEvent:
    seq: int
    at: float  # Unix seconds (UTC)
    event: str  # one of EVENTS
    voice_id: str | None
    detail: dict

    def to_dict(self) -> dict:
        return {"seq": self.seq, "at": self.at, "event": self.event, "voice_id": self.voice_id, **self.detail}


def create_tables(db: sqlite3.Connection) -> None:
    """Inside the caller's transaction (statement by statement: ``executescript`` would commit it)."""
    for statement in SCHEMA:
        db.execute(statement)


def record(db: sqlite3.Connection, event: str, voice_id: str | None, **detail) -> None:
    """Append an event (inside the caller's transaction)."""
    if event not in EVENTS:
        raise ValueError(f"unknown audit event {event!r}")
    db.execute("INSERT INTO audit (at, event, voice_id, detail) VALUES (?, ?, ?, ?)",
               (time.time(), event, voice_id, json.dumps(detail, ensure_ascii=False, sort_keys=True)))


def events(db: sqlite3.Connection, voice_id: str | None = None, limit: int = 1000) -> list[AuditEvent]:
    """The newest ``limit`` events (of one voice, or all), oldest first."""
    where, args = ("WHERE voice_id = ?", (voice_id,)) if voice_id is not None else ("", ())
    rows = db.execute(f"SELECT seq, at, event, voice_id, detail FROM audit {where} ORDER BY seq DESC LIMIT ?",
                      (*args, int(limit))).fetchall()
    return [AuditEvent(seq, at, event, vid, json.loads(detail)) for seq, at, event, vid, detail in reversed(rows)]


def block(db: sqlite3.Connection, sha256: str, reason: str) -> None:
    db.execute("INSERT OR IGNORE INTO blocked_audio (sha256, at, reason) VALUES (?, ?, ?)", (sha256, time.time(), reason))


def blocked(db: sqlite3.Connection, sha256: str) -> bool:
    return db.execute("SELECT 1 FROM blocked_audio WHERE sha256 = ?", (sha256,)).fetchone() is not None
