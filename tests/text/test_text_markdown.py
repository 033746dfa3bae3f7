"""Markdown markup is removed by ``normalize`` before reading; its words, and what only looks like it, stay."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cadenza.text import normalize
from cadenza.text.normalize.markdown import strip_markdown

READINGS = [
    ("**Important:** read this first.", "Important: read this first."),
    ("# Heading\nSome *italic* and `code` text.", "Heading\nSome italic and code text."),
    ("### Step two ###", "Step two"),
    ("Use the [user guide](https://example.org/guide \"Guide\") here.", "Use the user guide here."),
    ("![a cat](cat.png) sits there.", "a cat sits there."),
    ("- Buy milk\n- Walk the dog\n* Call mom\n+ Rest\n• Sleep", "Buy milk\nWalk the dog\nCall mom\nRest\nSleep"),
    ("***Very*** bold, __under__, _light_ and ~~struck~~.", "Very bold, under, light and struck."),
    ("```python\nprint(x)\n```\nDone.", "print(x)\n\nDone."),
    ("> A quote\n> > nested\n---\nAfter it.", "A quote\nnested\n\nAfter it."),
    ("Use ``a `tick` here`` now.", "Use a tick here now."),  # nested spans: all their ticks go
    ("a ** b", "a b"),
]

KEPT = [
    "2*3*4 is twenty-four",  # '*' between words is not emphasis (normalize reads it as "times")
    "the snake_case_name and file_2.txt",
    "[laughter] Yes [breath] no <strong>really</strong>",
    "a * b * c",
    "Go -- now - or later",
    "Item 1. Buy milk",
]


@pytest.mark.parametrize(("text", "read"), READINGS)
def test_markup_goes_and_words_stay(text, read):
    assert normalize(text) == read


@pytest.mark.parametrize("text", KEPT)
def test_what_only_looks_like_markup_stays(text):
    assert strip_markdown(text) == text


def test_tags_and_markup_together():
    assert normalize("<strong>**x**</strong> and [laughter] *y*") == "<strong>x</strong> and [laughter] y"
    # After a tag the text does not begin a line: "- yes" there is not a bullet.
    assert normalize("[laughter]- yes\n- no") == "[laughter]- yes\nno"
    # A bracket word before "(" is a link's text, not an event tag.
    assert normalize("See [docs](https://x.org) [sigh]") == "See docs [sigh]"


_MARKUP = st.text(st.sampled_from("*_`#->[]()!~ \nab1."), max_size=40)
_SETTINGS = settings(max_examples=500, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@_SETTINGS
@given(_MARKUP)
def test_normalizing_markup_again_changes_nothing(text):
    once = normalize(text)
    assert normalize(once) == once
    assert "**" not in once
