"""Markdown dropped from text in pieces: whatever the pieces, the text is that of the whole, and it reads as
``normalize`` reads the whole text (links aside)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cadenza.text.markdown_stream import MAX_HELD, MarkdownStream
from cadenza.text.normalize.markdown import strip_markdown

CASES = [
    ("**Important:** read this first.", "Important: read this first."),
    ("# Heading\nSome *italic* and `code` text.", "Heading\nSome italic and code text."),
    ("- Buy milk\n- Walk the dog\n* Call mom\n+ Rest", "Buy milk\nWalk the dog\nCall mom\nRest"),
    ("***Very*** bold, __under__, _light_ and ~~struck~~.", "Very bold, under, light and struck."),
    ("> A quote\n---\nAfter it.", "A quote\n\nAfter it."),
    ("Hello **world**, how are *you*?", "Hello world, how are you?"),
    ("2*3*4 and snake_case_name and a * b and ~5 and -5", "2*3*4 and snake_case_name and a * b and ~5 and -5"),
    ("> A quote\n>5 years\n- >=3 GB", "A quote\n>5 years\n>=3 GB"),  # ">" before a digit or "=": a comparison
]


def _pieces(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        j = i + rng.randint(1, 5)
        out.append(text[i:j])
        i = j
    return out


def _run(pieces: list[str]) -> str:
    stream = MarkdownStream()
    return "".join(stream.feed(p) for p in pieces) + stream.flush()


@pytest.mark.parametrize(("text", "read"), CASES)
def test_pieces_read_as_the_whole_text(text, read):
    assert _run([text]) == read == strip_markdown(text)
    for seed in range(40):
        assert _run(_pieces(text, random.Random(seed))) == read, seed
    assert _run(list(text)) == read  # a character at a time


def test_a_code_fence_line_goes_whole():
    assert _run(["``", "`pyth", "on\nprint(x)\n`", "``\nDone."]) == "\nprint(x)\n\nDone."


def test_what_is_held_back_is_bounded():
    stream = MarkdownStream()
    assert stream.feed("Note ") == "Note "
    assert stream.feed("**") == ""  # is the next character a letter?
    assert stream.feed("-" * (MAX_HELD + 10)) != ""  # a line of markers longer than any markup: passed on


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.text(st.sampled_from("*_`#->~ \nab1."), max_size=40), st.integers(0, 2**32 - 1))
def test_any_split_gives_the_same_text(text, seed):
    assert _run(_pieces(text, random.Random(seed))) == _run([text])
