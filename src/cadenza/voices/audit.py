"""The voice store's audit trail: an append-only log of what happened to voices, and the recordings taken down.

Both live in the voice database, written in the same transaction as the change they record, so the log and the
voices never disagree. The log cannot be edited through SQL (triggers refuse UPDATE and DELETE; on PostgreSQL also
TRUNCATE); it records events, not text content: the name and family of a voice, who declared the right to use it,
the hash of its recording, its use count when deleted -- never what was synthesised with it.

``blocked_audio`` holds the SHA-256 of recordings an operator took down: the store refuses to save the same
recording again (the same decoded samples; a re-encoded or edited copy hashes differently, see docs/provenance.md).

The functions run their SQL (``?`` placeholders, the same text on SQLite and PostgreSQL) through ``run``, the
backend's statement runner inside the caller's transaction.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

Run = Callable[[str, tuple], list[tuple]]  # (sql with ? placeholders, arguments) -> result rows

SQLITE_SCHEMA = (
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
# Row triggers do not fire on TRUNCATE: a statement trigger refuses that too. (The table's owner can still drop the
# triggers: docs/server.md#deployment says how to run replicas as a role that owns nothing.)
POSTGRES_SCHEMA = (
    """CREATE TABLE audit (
        seq      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at       double precision NOT NULL,
        event    text NOT NULL,
        voice_id text,
        detail   text NOT NULL
    )""",
    "CREATE INDEX audit_voice ON audit (voice_id, seq)",
    """CREATE FUNCTION cadenza_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$""",
    """CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit
    FOR EACH ROW EXECUTE FUNCTION cadenza_audit_append_only()""",
    """CREATE TRIGGER audit_append_only_truncate BEFORE TRUNCATE ON audit
    FOR EACH STATEMENT EXECUTE FUNCTION cadenza_audit_append_only()""",
    """CREATE TABLE blocked_audio (
        sha256   text PRIMARY KEY,
        at       double precision NOT NULL,
        reason   text NOT NULL
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


def record(run: Run, event: str, voice_id: str | None, **detail) -> None:
    """Append an event (inside the caller's transaction)."""
    if event not in EVENTS:
        raise ValueError(f"unknown audit event {event!r}")
    run("INSERT INTO audit (at, event, voice_id, detail) VALUES (?, ?, ?, ?)",
        (time.time(), event, voice_id, json.dumps(detail, ensure_ascii=False, sort_keys=True)))


def events(run: Run, voice_id: str | None = None, limit: int = 1000) -> list[AuditEvent]:
    """The newest ``limit`` events (of one voice, or all), oldest first."""
    where, args = ("WHERE voice_id = ?", (voice_id,)) if voice_id is not None else ("", ())
    rows = run(f"SELECT seq, at, event, voice_id, detail FROM audit {where} ORDER BY seq DESC LIMIT ?",
               (*args, int(limit)))
    return [AuditEvent(seq, at, event, vid, json.loads(detail)) for seq, at, event, vid, detail in reversed(rows)]


def block(run: Run, sha256: str, reason: str) -> None:
    run("INSERT INTO blocked_audio (sha256, at, reason) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        (sha256, time.time(), reason))


def blocked(run: Run, sha256: str) -> bool:
    return bool(run("SELECT 1 FROM blocked_audio WHERE sha256 = ?", (sha256,)))
