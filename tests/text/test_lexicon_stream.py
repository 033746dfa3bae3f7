"""``LexiconStream``: a lexicon over text in pieces gives exactly the lexicon over the whole text, however it is cut,
and lets text out as soon as no later piece can change it."""

from __future__ import annotations

import random

import pytest

from cadenza.errors import InputError
from cadenza.text.lexicon import Lexicon
from cadenza.text.lexicon_stream import LexiconStream

LEXICON = Lexicon.from_json([
    {"word": "New York", "respelling": "noo york"}, {"word": "Cadenza", "respelling": "ka den za"},
    {"word": "SQL", "respelling": "sequel", "case_sensitive": True}, {"word": "北京", "respelling": "bei jing"},
    {"word": "New York City Hall", "respelling": "the hall"}, {"word": "C++", "respelling": "C plus plus"},
    {"word": "warm", "respelling": "worm"},
])
TEXTS = [
    "I love New York today, Cadenza's SQL and Cadenzas. ",
    "(a warm voice)New York City Hall is in New  York",  # a VoxCPM 2 description is never looked into
    " (a warm voice)warm New York",
    "我爱北京，北京天安门。New York",
    "[laughter] Cadenza <|ph:kə dɛn|> SQL sql C++ x",  # tags, and phonemes with a space, are never cut
    "New\nYork Cadenza, warm (a warm voice).",
]


def _streamed(lexicon: Lexicon, pieces: list[str], phonemes=None) -> tuple[str, list[str]]:
    stream = LexiconStream(lexicon, phonemes)
    out = [stream.feed(p) for p in pieces]
    return "".join(out) + stream.flush(), out


@pytest.mark.parametrize("text", TEXTS)
def test_any_cut_gives_the_whole_texts_replacements(text):
    whole = LEXICON.apply(text)
    assert whole != text
    rng = random.Random(len(text))
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(10, len(text) - 1))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert _streamed(LEXICON, pieces)[0] == whole, pieces
    assert _streamed(LEXICON, list(text))[0] == whole  # one character at a time


def test_text_goes_out_once_no_later_piece_can_change_it():
    lexicon = Lexicon.from_json([{"word": "Cadenza", "respelling": "ka den za"}])  # one-word entries
    _, out = _streamed(lexicon, ["Cadenza ", "spe", "aks ", "Cadenza", "s now."])
    assert out == ["ka den za ", "", "speaks ", "", "Cadenzas "]  # a word may still grow until a space
    _, out = _streamed(LEXICON, ["I love ", "New ", "York ", "City ", "today. "])  # entries up to four words
    assert out == ["", "", "I ", "love ", ""]  # the last three words wait; "New York" is never cut


def test_a_phoneme_entry_for_a_model_that_reads_text_is_an_error():
    lexicon = Lexicon.from_json([{"word": "Cadenza", "phonemes": "kədˈɛnzə"}])
    with pytest.raises(InputError, match="'Cadenza' gives phonemes, but this model reads text"):
        _streamed(lexicon, ["Hi Cadenza ", "there."])
    said, _ = _streamed(lexicon, ["Hi Cadenza ", "there."], phonemes=set("kədˈɛnz"))
    assert said == "Hi <|ph:kədˈɛnzə|> there."
