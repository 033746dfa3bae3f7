"""Pronunciation lexicons saved with voices (``cadenza.text.lexicon``): one per voice, in the voice store's database.

::

    lexicons = lexicons_of(store)
    lexicons.put("alice", Lexicon.from_file("brands.json"))   # replaces the voice's lexicon
    lexicons.get("alice")                                     # Lexicon (empty when none was saved)
    lexicons.clear("alice")

A small table of its own, ``voice_lexicons (voice_id, entries JSON, updated_at)``, beside the store's tables and
written through the store's backend (SQLite or PostgreSQL); the first ``put`` creates it (reads never write, and
find no lexicon while it is missing). It follows its voice: deleting or taking down the voice
deletes its lexicon in the same transaction (PostgreSQL: ``ON DELETE CASCADE``; SQLite, whose connections do not
enforce foreign keys, a trigger). Entries are validated and bounded (``MAX_ENTRIES``, ``MAX_LEXICON_BYTES``) before
they are written.
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

_TABLE = ("CREATE TABLE IF NOT EXISTS voice_lexicons (voice_id TEXT PRIMARY KEY{fk}, entries TEXT NOT NULL, "
          "updated_at DOUBLE PRECISION NOT NULL)")
_SQLITE_TRIGGER = ("CREATE TRIGGER IF NOT EXISTS voice_lexicons_follow_voice AFTER DELETE ON voices "
                   "BEGIN DELETE FROM voice_lexicons WHERE voice_id = OLD.id; END")
_UPSERT = ("INSERT INTO voice_lexicons (voice_id, entries, updated_at) VALUES (?, ?, ?) ON CONFLICT (voice_id) "
           "DO UPDATE SET entries = excluded.entries, updated_at = excluded.updated_at")


class VoiceLexicons:
    """The lexicons of ``store``'s voices (thread-safe: every call is one statement or one transaction)."""

    def __init__(self, store: VoiceStore) -> None:
        self.store = store
        self._backend = store.backend
        self._sqlite = store.directory is not None
        self._created = False

    def _table_exists(self) -> bool:
        """Whether the table is there (it is made by the first ``put``: reading never writes to the database, so a
        server whose database role may not create tables still reads lexicons an operator saved)."""
        if not self._created:
            sql = ("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'voice_lexicons'" if self._sqlite
                   else "SELECT 1 WHERE to_regclass('voice_lexicons') IS NOT NULL")
            self._created = bool(self._backend._read(sql))
        return self._created

    def _create(self, run) -> None:
        run(_TABLE.format(fk="" if self._sqlite else " REFERENCES voices (id) ON DELETE CASCADE"), ())
        if self._sqlite:
            run(_SQLITE_TRIGGER, ())

    def get(self, id_or_name: str) -> Lexicon:
        """The voice's lexicon (empty when it has none); ``UnknownSpeakerError`` for no such voice."""
        record = self.store.get(id_or_name)
        return self._read(record.id) or Lexicon()

    def lexicon_of(self, id_or_name: str) -> Lexicon | None:
        """The lexicon of a voice used for synthesis, or None (no such voice -- the request fails on it
        elsewhere -- or no lexicon saved)."""
        try:
            record = self.store.get(id_or_name)
        except (UnknownSpeakerError, InputError):
            return None
        return self._read(record.id)

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
        with self._backend._write() as run:
            self._create(run)
            if not run("SELECT 1 FROM voices WHERE id = ?", (record.id,)):  # deleted since: write nothing
                raise UnknownSpeakerError(f"unknown voice {record.id!r}")
            run(_UPSERT, (record.id, data, time.time()))
        self._created = True
        return record

    def clear(self, id_or_name: str) -> bool:
        """Remove the voice's lexicon; True if it had one."""
        record = self.store.get(id_or_name)
        if not self._table_exists():
            return False
        with self._backend._write() as run:
            return bool(run("DELETE FROM voice_lexicons WHERE voice_id = ? RETURNING voice_id", (record.id,)))

    def _read(self, voice_id: str) -> Lexicon | None:
        if not self._table_exists():
            return None
        rows = self._backend._read("SELECT entries FROM voice_lexicons WHERE voice_id = ?", (voice_id,))
        return Lexicon.from_json(json.loads(rows[0][0]), f"the lexicon of voice {voice_id}") if rows else None


_open: weakref.WeakKeyDictionary[VoiceStore, VoiceLexicons] = weakref.WeakKeyDictionary()
_open_lock = threading.Lock()


def lexicons_of(store: VoiceStore) -> VoiceLexicons:
    """The ``VoiceLexicons`` of ``store`` (one per store object)."""
    with _open_lock:
        lexicons = _open.get(store)
        if lexicons is None:
            lexicons = _open[store] = VoiceLexicons(store)
        return lexicons
