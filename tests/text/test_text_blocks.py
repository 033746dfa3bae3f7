"""``text_blocks``: a long raw text cut where planning it in pieces changes nothing (paragraph breaks, confirmed
sentence ends), joined back exactly."""

from __future__ import annotations

import pytest

from cadenza.errors import InputError, TextError
from cadenza.text.blocks import text_blocks


def test_blocks_join_back_to_the_text_and_keep_their_bound():
    text = ("Dr. Smith paid $3.14 at 5 p.m. It was late. " * 30 + "\n\n" + "A new paragraph starts here. " * 40
            + "\n \n" + "x" * 50)
    blocks = list(text_blocks(text, 300))
    assert "".join(blocks) == text and len(blocks) > 5
    assert all(0 < len(b) <= 300 for b in blocks)


def test_a_paragraph_break_past_half_the_block_is_the_cut():
    text = "One sentence here. " * 5 + "\n\n" + "Another one there. " * 20
    first = next(text_blocks(text, 140))
    assert first == "One sentence here. " * 5 + "\n\n"


def test_else_a_confirmed_sentence_end_never_an_abbreviation_or_a_number():
    text = "We met Dr. Smith at 3.14 p.m. in the hall. " * 10
    for block in list(text_blocks(text, 120))[:-1]:
        assert block.endswith("the hall."), block[-30:]


def test_else_whitespace_and_only_then_inside_a_word():
    text = "word " * 100  # no sentence end at all
    blocks = list(text_blocks(text, 52))
    assert all(b.endswith(" ") for b in blocks[:-1]) and "".join(blocks) == text
    solid = "a" * 250
    assert [len(b) for b in text_blocks(solid, 100)] == [100, 100, 50]


def test_short_and_bad_input():
    assert list(text_blocks("Hello.", 100)) == ["Hello."]
    assert list(text_blocks("", 100)) == []
    with pytest.raises(TextError):
        list(text_blocks(b"bytes", 100))
    for bad in (0, 1, True, 2.5):
        with pytest.raises(InputError):
            list(text_blocks("Hello.", bad))
