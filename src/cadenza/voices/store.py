"""``VoiceStore``: saved voices -- validation, consent records, retention, takedown -- over a database backend.

The store checks everything (names, transcripts, consent, audio: size, duration, silence) and builds each record;
a ``VoiceBackend`` holds them. Where the voices live is one argument:

* a folder (the default): one SQLite file plus a folder of computed features (``SQLiteBackend``), shared safely by
  the processes of one machine;
* a ``postgresql://`` URL: a PostgreSQL database that server replicas on many machines share (``PostgresBackend``,
  the ``postgres`` extra).

Both behave the same (the same SQL, tests run against both); docs/server.md#deployment says how to run replicas.
"""

from __future__ import annotations

import io
import logging
import os
import secrets
import time
import unicodedata
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from cadenza.audio.wav_stream import int16_samples
from cadenza.errors import InputError, UnknownSpeakerError
from cadenza.voices.audit import AuditEvent
from cadenza.voices.backend import NameTakenError, NewVoice, VoiceBackend, VoiceStoreUnavailableError
from cadenza.voices.migrations import SCHEMA_VERSION, SchemaTooNewError
from cadenza.voices.postgres_backend import is_postgres_url
from cadenza.voices.records import DEFAULT_FAMILY, VoiceRecord, audio_hash, name_key, stored_samples, tensor_bytes
from cadenza.voices.sqlite_backend import CACHE_DIR, DB_NAME
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

__all__ = ["CACHE_DIR", "DB_NAME", "DEFAULT_FAMILY", "SCHEMA_VERSION", "SchemaTooNewError", "VoiceRecord",
           "VoiceStore", "VoiceStoreUnavailableError", "audio_hash", "name_key", "stored_samples"]


class VoiceStore:
    """Voices saved at ``location``: a folder (created if needed) or a ``postgresql://`` URL. Shared safely by
    threads, processes and -- with PostgreSQL -- server replicas on several machines.

    ``max_audio_bytes`` bounds an encoded upload; ``max_seconds`` bounds the prompt's duration (the frontends read
    at most 30 s). ``busy_timeout_s``: how long a write waits for another writer (SQLite: another process's write
    transaction; PostgreSQL: a row lock).
    """

    def __init__(self, location: str | os.PathLike, max_audio_bytes: int = DEFAULT_MAX_AUDIO_BYTES,
                 max_seconds: float = 30.0, busy_timeout_s: float = 10.0) -> None:
        self.max_audio_bytes = int(max_audio_bytes)
        self.max_seconds = float(max_seconds)
        if self.max_audio_bytes <= 0 or self.max_seconds <= 0:
            raise ValueError("max_audio_bytes and max_seconds must be positive")
        self.backend: VoiceBackend
        if is_postgres_url(location):
            from cadenza.voices.postgres_backend import PostgresBackend

            self.directory: Path | None = None  # (SQLite only: the folder)
            self.backend = PostgresBackend(str(location), busy_timeout_s)
        else:
            from cadenza.voices.sqlite_backend import SQLiteBackend

            self.directory = Path(location).expanduser()
            self.backend = SQLiteBackend(self.directory, busy_timeout_s)
        self.location = self.backend.location  # for messages (never a password)
        self.drop_expired_audio()

    def close(self) -> None:
        self.backend.close()

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
        if self.backend.name_taken(name_key(name), name):
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
        name, name taken -- also when another writer took it a moment ago --, no consent, a recording that was taken
        down) or ``AudioError``. The creation is logged (``audit_log``).

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
        digest = audio_hash(int16_samples(wav.numpy()))
        now = time.time()
        voice_id = ID_PREFIX + secrets.token_urlsafe(ID_TOKEN_BYTES)
        expires = now + audio_ttl_s if keep_audio and audio_ttl_s is not None else None
        record = VoiceRecord(voice_id, name, transcript, consent, now, now, sr, int(wav.numel()), family, cloning,
                             declared_by, digest, keep_audio, expires)
        pinned = tuple((validate_model_key(key), tensor_bytes(t, voice_id, key)) for key, t in (features or {}).items())
        try:
            saved = self.backend.insert_voice(NewVoice(record, name_key(name), blob, pinned))
        except NameTakenError:
            raise self._taken(name) from None
        if not saved:
            raise InputError("this recording was taken down by the operator and cannot be saved as a voice again")
        return record

    def list(self) -> list[VoiceRecord]:
        """All voices, oldest first."""
        return self.backend.voices()

    def get(self, id_or_name: str) -> VoiceRecord:
        """A voice by id, or else by name (case-insensitive). Raises ``UnknownSpeakerError``."""
        if not isinstance(id_or_name, str):
            raise UnknownSpeakerError(f"a voice is named by a string, not {type(id_or_name).__name__}")
        try:
            id_or_name.encode("utf-8")
        except UnicodeEncodeError:  # not text any name or id can be (e.g. a lone surrogate from JSON)
            raise UnknownSpeakerError(f"unknown voice {id_or_name[:80]!r}: not valid Unicode text") from None
        if looks_like_id(id_or_name):
            record = self.backend.voice_by_id(id_or_name)
        else:  # schema-1 SQLite names that fold to an older voice's key: by exact name
            record = self.backend.voice_by_name(name_key(id_or_name), unicodedata.normalize("NFC", id_or_name))
        if record is None:
            raise UnknownSpeakerError(f"unknown voice {id_or_name[:80]!r}")
        return record

    def __contains__(self, id_or_name: str) -> bool:
        try:
            self.get(id_or_name)
        except UnknownSpeakerError:
            return False
        return True

    def existing(self, voice_ids: list[str]) -> set[str]:
        """Which of these ids are still saved (others may have been deleted by another process or replica)."""
        return self.backend.existing([v for v in voice_ids if looks_like_id(v)])

    def delete(self, voice_id: str) -> None:
        """Delete a voice and its cached features. Raises ``UnknownSpeakerError`` if there is none with that id."""
        self._delete(voice_id, "deleted")

    def _delete(self, voice_id: str, event: str, reason: str | None = None) -> dict:
        validate_voice_id(voice_id)
        detail = self.backend.delete_voice(voice_id, event, reason)
        if detail is None:
            raise UnknownSpeakerError(f"unknown voice {voice_id!r}")
        return detail

    def takedown(self, id_or_name: str, reason: str) -> dict:
        """An operator's takedown: delete the voice and its cached features, and refuse its recording from now on
        (``add`` raises for the same samples). ``reason`` is logged. Returns what was removed."""
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 1000:
            raise InputError("a takedown needs a reason (1-1000 characters): it is kept in the audit log")
        record = self.get(id_or_name)
        return {"id": record.id, **self._delete(record.id, "takedown", reason.strip())}

    def record_use(self, voice_id: str) -> None:
        """Count one synthesis with the voice (the audit log's use counts); drop recordings past their time."""
        self.backend.record_use(voice_id, time.time())

    def drop_expired_audio(self) -> int:
        """Remove kept recordings whose time is up (their voices keep working from their pinned features).
        Returns how many were dropped."""
        return self.backend.drop_expired_audio(time.time())

    def consent_record(self, id_or_name: str) -> dict:
        """The voice's consent record, for export: the declaration, who made it and when, the recording's hash,
        the family it was made for, its use count."""
        record = self.get(id_or_name)
        uses, last = self.backend.uses(record.id) or (0, None)
        return {"voice_id": record.id, "name": record.name, "declaration": record.consent,
                "declared_by": record.declared_by, "declared_at": record.consent_at,
                "audio_sha256": record.audio_sha256, "family": record.family, "created_at": record.created_at,
                "uses": uses, "last_used_at": last}

    def audit_log(self, voice_id: str | None = None, limit: int = 1000) -> list[AuditEvent]:
        """Events (created, deleted, takedown, blocked_attempt, audio_expired) of one voice or all, oldest first."""
        return self.backend.audit_events(voice_id, limit)

    def audio(self, voice_id: str) -> tuple[np.ndarray, int]:
        """The stored prompt: float32 mono samples in [-1, 1] and their sample rate."""
        blob = self.backend.audio(validate_voice_id(voice_id))
        if blob is None:
            raise UnknownSpeakerError(f"unknown voice {voice_id!r}")
        if not blob:
            raise InputError(f"voice {voice_id!r} keeps no recording, only the features of the model it was made "
                             "with: create it again to use it with other model files")
        samples, sr = sf.read(io.BytesIO(blob), dtype="float32")
        return samples, int(sr)

    # -- prompt features -----------------------------------------------------------------------------------------
    def cached_prompt(self, voice_id: str, model_key: str) -> dict[str, torch.Tensor] | None:
        """Features pinned with the voice (``add(features=...)``) or saved by ``cache_prompt`` for this voice and
        model, or ``None`` (not cached, voice deleted, or unreadable, in which case the cached copy is removed)."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        validate_voice_id(voice_id)
        validate_model_key(model_key)
        pinned = self.backend.pinned_features(voice_id, model_key)
        if pinned is not None:
            return load(pinned)
        data = self.backend.cached_features(voice_id, model_key)
        if data is None:
            return None
        try:
            return load(data)
        except (SafetensorError, ValueError) as exc:
            log.warning("dropping unreadable prompt cache of %s (%s): %s", voice_id,
                                                model_key, exc)
            self.backend.drop_cached(voice_id, model_key)
            return None

    def cache_prompt(self, voice_id: str, model_key: str, tensors: dict[str, torch.Tensor]) -> None:
        """Save computed prompt features (safetensors; written atomically). Raises ``UnknownSpeakerError`` if the
        voice does not exist."""
        validate_voice_id(voice_id)
        validate_model_key(model_key)
        self.backend.cache_features(voice_id, model_key, tensor_bytes(tensors, voice_id, model_key))


def open_voices(location: str | os.PathLike | None) -> VoiceStore | None:
    """The voice store a library caller names (``voices_dir=``): a ``postgresql://`` URL, a folder that exists, or a
    new folder inside one that does; None for None. A folder whose parent is missing is an ``InputError``: a
    mistyped path would otherwise become a new, empty store, and the voices the caller meant would be "unknown"."""
    if location is None:
        return None
    if not is_postgres_url(location):
        folder = Path(location).expanduser()
        if not folder.is_dir() and not folder.parent.is_dir():
            raise InputError(f"voices_dir {str(location)[:200]!r} does not exist, nor does its folder "
                             f"{str(folder.parent)[:200]!r}: check the path (a new store is made only inside an "
                             "existing folder)")
        if folder.exists() and not folder.is_dir():
            raise InputError(f"voices_dir {str(location)[:200]!r} is a file, not a folder")
    return VoiceStore(location)
