"""``VoiceBackend``: what a database must do to hold saved voices, for ``VoiceStore`` (which validates everything
before it reaches a backend). Two implementations: ``SQLiteBackend`` (one file, embedded, the default) and
``PostgresBackend`` (a server that several replicas share). Both run the same SQL (``SQLBackend``), so they behave
the same; they differ in connections, transactions, migrations and where computed features are cached.

Every write that changes a voice also writes its audit event, in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cadenza.errors import CadenzaError
from cadenza.voices.audit import AuditEvent
from cadenza.voices.records import VoiceRecord


class NameTakenError(Exception):
    """The backend's unique name index refused a voice (another writer got the name first)."""


class VoiceStoreUnavailableError(CadenzaError):
    """The voice database cannot be reached right now (a server answers 503: retry, or another replica)."""


@dataclass(frozen=True)
class NewVoice:
    """A validated voice to insert: its record, name key, encoded recording (``b""``: not kept) and pinned features
    (``(model key, safetensors bytes)``)."""

    record: VoiceRecord
    name_key: str
    audio: bytes
    features: tuple[tuple[str, bytes], ...]


class VoiceBackend(Protocol):
    location: str  # for messages: a path, or a database URL without its password

    def name_taken(self, key: str, name: str) -> bool: ...

    def insert_voice(self, voice: NewVoice) -> bool:
        """Insert with its pinned features and a ``created`` event; ``False`` (and a ``blocked_attempt`` event, no
        voice) if its recording was taken down. Raises ``NameTakenError``."""

    def voices(self) -> list[VoiceRecord]: ...  # oldest first

    def voice_by_id(self, voice_id: str) -> VoiceRecord | None: ...

    def voice_by_name(self, key: str, exact: str) -> VoiceRecord | None:
        """By ``name_key``, else by exact name (SQLite schema-1 names that fold to an older voice's key)."""

    def existing(self, voice_ids: list[str]) -> set[str]: ...

    def delete_voice(self, voice_id: str, event: str, reason: str | None) -> dict | None:
        """Delete the voice, its pinned and cached features; log ``event`` (a takedown also blocks the recording).
        Returns ``{"name", "audio_sha256", "uses"}`` (+ ``reason``), or ``None`` when there is no such voice."""

    def record_use(self, voice_id: str, now: float) -> None: ...

    def drop_expired_audio(self, now: float) -> int: ...

    def uses(self, voice_id: str) -> tuple[int, float | None] | None: ...

    def audit_events(self, voice_id: str | None, limit: int) -> list[AuditEvent]: ...

    def audio(self, voice_id: str) -> bytes | None:
        """The encoded recording (``b""``: not kept), or ``None`` when there is no such voice."""

    def pinned_features(self, voice_id: str, model_key: str) -> bytes | None: ...

    def cached_features(self, voice_id: str, model_key: str) -> bytes | None: ...

    def cache_features(self, voice_id: str, model_key: str, data: bytes) -> None:
        """Raises ``UnknownSpeakerError`` when the voice does not exist (or is deleted meanwhile)."""

    def drop_cached(self, voice_id: str, model_key: str) -> None: ...

    def lexicon(self, voice_id: str) -> str | None:
        """The voice's pronunciation lexicon as stored (a JSON list of entries), or ``None`` when it has none."""

    def put_lexicon(self, voice_id: str, entries: str, now: float) -> bool:
        """Replace the voice's lexicon with ``entries`` (validated JSON); ``False`` (nothing written) when the voice
        does not exist (or is deleted meanwhile). Deleting the voice deletes its lexicon in the same transaction."""

    def delete_lexicon(self, voice_id: str) -> bool:
        """Remove the voice's lexicon; ``True`` if it had one."""

    def close(self) -> None: ...
