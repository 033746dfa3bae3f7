"""``SQLBackend``: the voice store's SQL, written once for SQLite and PostgreSQL (``?`` placeholders; a backend
turns them into its own). A subclass supplies ``_read`` (one statement outside a transaction), ``_write`` (a
transaction, yielding a statement runner), ``_is_name_conflict``, ``_is_missing_voice`` and the feature cache.

Statements that decide something under concurrency do it in one statement (``DELETE ... RETURNING``,
``UPDATE ... RETURNING``), so two replicas deleting the same voice, or dropping the same expired recording, log it
once.
"""

from __future__ import annotations

import contextlib

from cadenza.voices import audit
from cadenza.voices.audit import AuditEvent, Run
from cadenza.voices.backend import NameTakenError, NewVoice
from cadenza.voices.records import DEFAULT_FAMILY, VoiceRecord

_COLUMNS = ("id, name, transcript, consent, consent_at, created_at, sample_rate, num_samples, "
            f"COALESCE(family, '{DEFAULT_FAMILY}'), cloning, declared_by, audio_sha256, length(audio) > 0, "
            "audio_expires_at")
_INSERT = ("INSERT INTO voices (id, name, transcript, consent, consent_at, created_at, sample_rate, num_samples, "
           "family, cloning, declared_by, audio_sha256, audio_expires_at, name_key, audio) "
           f"VALUES ({', '.join('?' * 15)})")
_UPSERT_LEXICON = ("INSERT INTO voice_lexicons (voice_id, entries, updated_at) VALUES (?, ?, ?) ON CONFLICT (voice_id) "
                   "DO UPDATE SET entries = excluded.entries, updated_at = excluded.updated_at")


def _record(row: tuple) -> VoiceRecord:
    return VoiceRecord(*row[:12], bool(row[12]), row[13])  # SQLite says 0/1 for the comparison, PostgreSQL a bool


class SQLBackend:
    location: str

    # -- what a backend supplies ---------------------------------------------------------------------------------
    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        raise NotImplementedError

    def _write(self) -> contextlib.AbstractContextManager[Run]:
        raise NotImplementedError

    def _is_name_conflict(self, exc: Exception) -> bool:
        raise NotImplementedError

    def _is_missing_voice(self, exc: Exception) -> bool:
        """Whether a write failed because the voice it refers to is gone (a foreign key, where one is enforced)."""
        return False

    def _after_delete(self, voice_id: str) -> None:
        """After a voice's rows are gone (committed): remove what lives outside the database."""

    # -- voices --------------------------------------------------------------------------------------------------
    def name_taken(self, key: str, name: str) -> bool:
        return bool(self._read("SELECT 1 FROM voices WHERE name_key = ? OR name = ?", (key, name)))

    def insert_voice(self, voice: NewVoice) -> bool:
        r = voice.record
        try:
            with self._write() as run:
                if audit.blocked(run, r.audio_sha256):
                    audit.record(run, "blocked_attempt", None, name=r.name, audio_sha256=r.audio_sha256)
                    return False
                run(_INSERT, (r.id, r.name, r.transcript, r.consent, r.consent_at, r.created_at, r.sample_rate,
                              r.num_samples, r.family, r.cloning, r.declared_by, r.audio_sha256, r.audio_expires_at,
                              voice.name_key, voice.audio))
                for key, data in voice.features:
                    run("INSERT INTO voice_features (voice_id, model_key, data) VALUES (?, ?, ?)", (r.id, key, data))
                audit.record(run, "created", r.id, name=r.name, family=r.family, declared_by=r.declared_by,
                             audio_sha256=r.audio_sha256)
        except Exception as exc:
            if self._is_name_conflict(exc):
                raise NameTakenError(r.name) from exc
            raise
        return True

    def voices(self) -> list[VoiceRecord]:
        return [_record(row) for row in self._read(f"SELECT {_COLUMNS} FROM voices ORDER BY created_at, id")]

    def voice_by_id(self, voice_id: str) -> VoiceRecord | None:
        rows = self._read(f"SELECT {_COLUMNS} FROM voices WHERE id = ?", (voice_id,))
        return _record(rows[0]) if rows else None

    def voice_by_name(self, key: str, exact: str) -> VoiceRecord | None:
        rows = (self._read(f"SELECT {_COLUMNS} FROM voices WHERE name_key = ?", (key,))
                or self._read(f"SELECT {_COLUMNS} FROM voices WHERE name = ?", (exact,)))
        return _record(rows[0]) if rows else None

    def existing(self, voice_ids: list[str]) -> set[str]:
        if not voice_ids:
            return set()
        marks = ", ".join("?" * len(voice_ids))
        return {row[0] for row in self._read(f"SELECT id FROM voices WHERE id IN ({marks})", tuple(voice_ids))}

    def delete_voice(self, voice_id: str, event: str, reason: str | None) -> dict | None:
        with self._write() as run:
            rows = run("DELETE FROM voices WHERE id = ? RETURNING name, audio_sha256, uses", (voice_id,))
            if not rows:
                return None
            name, digest, uses = rows[0]
            run("DELETE FROM voice_features WHERE voice_id = ?", (voice_id,))
            self._delete_cached(run, voice_id)
            detail = {"name": name, "audio_sha256": digest, "uses": uses}
            if event == "takedown":
                detail["reason"] = reason
                if digest is not None:
                    audit.block(run, digest, reason or "takedown")
            audit.record(run, event, voice_id, **detail)
        self._after_delete(voice_id)
        return detail

    def _delete_cached(self, run: Run, voice_id: str) -> None:
        """Inside the delete's transaction: cached features kept in the database."""

    def record_use(self, voice_id: str, now: float) -> None:
        with self._write() as run:
            run("UPDATE voices SET uses = uses + 1, last_used_at = ? WHERE id = ?", (now, voice_id))
            self._drop_expired(run, now)

    def drop_expired_audio(self, now: float) -> int:
        with self._write() as run:
            return self._drop_expired(run, now)

    def _drop_expired(self, run: Run, now: float) -> int:
        expired = run("UPDATE voices SET audio = ?, audio_expires_at = NULL "
                      "WHERE audio_expires_at <= ? AND length(audio) > 0 RETURNING id, name", (b"", now))
        for voice_id, name in expired:
            audit.record(run, "audio_expired", voice_id, name=name)
        return len(expired)

    def uses(self, voice_id: str) -> tuple[int, float | None] | None:
        rows = self._read("SELECT uses, last_used_at FROM voices WHERE id = ?", (voice_id,))
        return (int(rows[0][0]), rows[0][1]) if rows else None

    def audit_events(self, voice_id: str | None, limit: int) -> list[AuditEvent]:
        return audit.events(self._read, voice_id, limit)

    def audio(self, voice_id: str) -> bytes | None:
        rows = self._read("SELECT audio FROM voices WHERE id = ?", (voice_id,))
        return bytes(rows[0][0]) if rows else None

    def pinned_features(self, voice_id: str, model_key: str) -> bytes | None:
        rows = self._read("SELECT data FROM voice_features WHERE voice_id = ? AND model_key = ?", (voice_id, model_key))
        return bytes(rows[0][0]) if rows else None

    # -- pronunciation lexicons (one per voice; deleted with the voice by the schema) -------------------------------
    def lexicon(self, voice_id: str) -> str | None:
        rows = self._read("SELECT entries FROM voice_lexicons WHERE voice_id = ?", (voice_id,))
        return rows[0][0] if rows else None

    def put_lexicon(self, voice_id: str, entries: str, now: float) -> bool:
        try:
            with self._write() as run:
                if not run("SELECT 1 FROM voices WHERE id = ?", (voice_id,)):  # deleted since it was looked up
                    return False
                run(_UPSERT_LEXICON, (voice_id, entries, now))
        except Exception as exc:
            if self._is_missing_voice(exc):  # PostgreSQL: deleted between the check and the insert
                return False
            raise
        return True

    def delete_lexicon(self, voice_id: str) -> bool:
        with self._write() as run:
            return bool(run("DELETE FROM voice_lexicons WHERE voice_id = ? RETURNING voice_id", (voice_id,)))
