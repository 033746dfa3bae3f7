"""Pronunciation lexicons saved with voices, on both store backends (SQLite and PostgreSQL): put / get / clear,
bounds, a voice deleted between its lookup and the write, and the lexicon deleted with its voice (delete and
takedown). (The table is part of schema 5: its migrations are tested in test_voice_store_replicas.py.)"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from cadenza.errors import InputError, UnknownSpeakerError
from cadenza.text.lexicon import Lexicon
from cadenza.voices import VoiceStore
from cadenza.voices.lexicons import VoiceLexicons
from cadenza.voices.postgres_backend import is_postgres_url

CONSENT = "I, the speaker, agree that this recording may be used to synthesise my voice."
SR = 16000
LEXICON = Lexicon.from_json([{"word": "Cadenza", "respelling": "ka den za"},
                             {"word": "nginx", "phonemes": "ˈɛndʒɪnˌɛks", "case_sensitive": True}])


def _voice(store: VoiceStore, name: str, freq: float):
    t = np.arange(2 * SR) / SR
    return store.add(name, ((0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), SR), None, CONSENT)


def _lexicon_rows(location: str) -> list[tuple]:
    """Every row of ``voice_lexicons``, read over a connection of its own (not the store's)."""
    sql = "SELECT voice_id FROM voice_lexicons ORDER BY voice_id"
    if is_postgres_url(location):
        import psycopg

        with psycopg.connect(location, autocommit=True) as db:
            return db.execute(sql).fetchall()
    with sqlite3.connect(Path(location) / "voices.sqlite3") as db:
        return db.execute(sql).fetchall()


@pytest.fixture
def store(voices_location):
    with VoiceStore(voices_location) as s:
        yield s


def test_put_get_clear_and_follow_the_voice(store, voices_location):
    alice, bob = _voice(store, "alice", 220.0), _voice(store, "bob", 330.0)
    lexicons = VoiceLexicons(store)
    assert lexicons.lexicon_of("alice") is None and lexicons.get("alice").entries == ()
    assert lexicons.put("alice", LEXICON).id == alice.id
    assert lexicons.get(alice.id).to_json() == LEXICON.to_json()
    assert VoiceLexicons(store).lexicon_of("alice").to_json() == LEXICON.to_json()  # a second reader sees it
    lexicons.put("bob", LEXICON)
    assert lexicons.clear("bob") and not lexicons.clear("bob")
    assert lexicons.lexicon_of("bob") is None
    lexicons.put("bob", LEXICON)
    lexicons.put("bob", Lexicon())  # an empty lexicon removes it
    assert lexicons.lexicon_of("bob") is None

    with pytest.raises(UnknownSpeakerError):
        lexicons.put("nobody", LEXICON)
    with pytest.raises(InputError, match="must be a Lexicon"):
        lexicons.put("alice", [{"word": "x", "respelling": "y"}])
    assert lexicons.lexicon_of("nobody") is None  # synthesis with an unknown voice fails elsewhere, not here
    assert _lexicon_rows(voices_location) == [(alice.id,)]

    # Deleted with its voice, in the store's own transaction (SQLite: a trigger; PostgreSQL: ON DELETE CASCADE).
    lexicons.put("bob", LEXICON)
    assert _lexicon_rows(voices_location) == sorted([(alice.id,), (bob.id,)])
    store.delete(bob.id)
    assert _lexicon_rows(voices_location) == [(alice.id,)]
    store.takedown("alice", "test takedown")
    assert _lexicon_rows(voices_location) == []


def test_a_voice_deleted_between_its_lookup_and_the_write_gets_no_lexicon(store, voices_location):
    """``put`` looks the voice up, then writes in a transaction of its own: a delete in between writes nothing."""
    gone = _voice(store, "gone", 220.0)
    store.delete(gone.id)
    assert store.backend.put_lexicon(gone.id, '[{"word":"x","respelling":"y"}]', 0.0) is False
    assert store.backend.lexicon(gone.id) is None and not store.backend.delete_lexicon(gone.id)
    assert _lexicon_rows(voices_location) == []
