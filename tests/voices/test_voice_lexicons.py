"""Pronunciation lexicons saved with voices, on both store backends (SQLite and PostgreSQL): put / get / clear,
bounds, the table appearing only on the first write, and the lexicon deleted with its voice (delete and takedown)."""

from __future__ import annotations

import numpy as np
import pytest

from cadenza.errors import InputError, UnknownSpeakerError
from cadenza.text.lexicon import Lexicon
from cadenza.voices import VoiceStore
from cadenza.voices.lexicons import VoiceLexicons

CONSENT = "I, the speaker, agree that this recording may be used to synthesise my voice."
SR = 16000
LEXICON = Lexicon.from_json([{"word": "Cadenza", "respelling": "ka den za"},
                             {"word": "nginx", "phonemes": "ˈɛndʒɪnˌɛks", "case_sensitive": True}])


def _voice(store: VoiceStore, name: str, freq: float):
    t = np.arange(2 * SR) / SR
    return store.add(name, ((0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), SR), None, CONSENT)


@pytest.fixture
def store(voices_location):
    with VoiceStore(voices_location) as s:
        yield s


def test_put_get_clear_and_follow_the_voice(store):
    alice, bob = _voice(store, "alice", 220.0), _voice(store, "bob", 330.0)
    lexicons = VoiceLexicons(store)
    assert lexicons.lexicon_of("alice") is None and lexicons.get("alice").entries == ()  # no table yet: no write
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

    # Deleted with its voice, in the store's own transaction (SQLite: a trigger; PostgreSQL: ON DELETE CASCADE).
    lexicons.put("bob", LEXICON)
    store.delete(bob.id)
    store.takedown("alice", "test takedown")
    assert lexicons._backend._read("SELECT voice_id FROM voice_lexicons") == []
