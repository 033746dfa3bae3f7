"""Pronunciation lexicons saved with voices (``cadenza.text.lexicon``): one per voice, in the voice store's database.

::

    lexicons = lexicons_of(store)
    lexicons.put("alice", Lexicon.from_file("brands.json"))   # replaces the voice's lexicon
    lexicons.get("alice")                                     # Lexicon (empty when none was saved)
    lexicons.clear("alice")

Stored in the voice store's database (SQLite or PostgreSQL), in the ``voice_lexicons`` table of its schema
(``cadenza/voices/migrations.py``, schema 5), through the backend's lexicon methods. A lexicon follows its voice:
deleting or taking down the voice deletes its lexicon in the same transaction (PostgreSQL: ``ON DELETE CASCADE``;
SQLite, whose connections do not enforce foreign keys, a trigger). Entries are validated and bounded
(``MAX_ENTRIES``, ``MAX_LEXICON_BYTES``) before they are written.
"""

from __future__ import annotations

import json
import threading
import time
import weakref

from cadenza.errors import InputError, UnknownSpeakerError
from cadenza.text.lexicon import MAX_LEXICON_BYTES, Lexicon
from cadenza.voices.records import VoiceRecord
from cadenza.voices.store import VoiceStore


class VoiceLexicons:
    """The lexicons of ``store``'s voices (thread-safe: every call is one statement or one transaction)."""

    def __init__(self, store: VoiceStore) -> None:
        self.store = store

    def get(self, id_or_name: str) -> Lexicon:
        """The voice's lexicon (empty when it has none); ``UnknownSpeakerError`` for no such voice."""
        record = self.store.get(id_or_name)
        return self._saved(record.id) or Lexicon()

    def lexicon_of(self, id_or_name: str) -> Lexicon | None:
        """The lexicon of a voice used for synthesis, or None (no such voice -- the request fails on it
        elsewhere -- or no lexicon saved)."""
        try:
            record = self.store.get(id_or_name)
        except (UnknownSpeakerError, InputError):
            return None
        return self._saved(record.id)

    def put(self, id_or_name: str, lexicon: Lexicon) -> VoiceRecord:
        """Replace the voice's lexicon (an empty one removes it). Returns the voice."""
        if not isinstance(lexicon, Lexicon):
            raise InputError(f"a voice's lexicon must be a Lexicon, not {type(lexicon).__name__}")
        record = self.store.get(id_or_name)
        if not lexicon:
            self.clear(record.id)
            return record
        data = json.dumps(lexicon.to_json()["entries"], ensure_ascii=False, separators=(",", ":"))
        if len(data.encode("utf-8")) > MAX_LEXICON_BYTES:
            raise InputError(f"the lexicon is {len(data.encode('utf-8'))} bytes as JSON; at most {MAX_LEXICON_BYTES}")
        if not self.store.backend.put_lexicon(record.id, data, time.time()):  # deleted since: nothing written
            raise UnknownSpeakerError(f"unknown voice {record.id!r}")
        return record

    def clear(self, id_or_name: str) -> bool:
        """Remove the voice's lexicon; True if it had one."""
        return self.store.backend.delete_lexicon(self.store.get(id_or_name).id)

    def _saved(self, voice_id: str) -> Lexicon | None:
        entries = self.store.backend.lexicon(voice_id)
        return None if entries is None else Lexicon.from_json(json.loads(entries), f"the lexicon of voice {voice_id}")


_open: weakref.WeakKeyDictionary[VoiceStore, VoiceLexicons] = weakref.WeakKeyDictionary()
_open_lock = threading.Lock()


def lexicons_of(store: VoiceStore) -> VoiceLexicons:
    """The ``VoiceLexicons`` of ``store`` (one per store object)."""
    with _open_lock:
        lexicons = _open.get(store)
        if lexicons is None:
            lexicons = _open[store] = VoiceLexicons(store)
        return lexicons
