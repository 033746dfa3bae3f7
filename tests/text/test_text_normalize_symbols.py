"""Comparison signs, ``^`` and mathematical letters in ``normalize``: read where they are what they look like, left as
written where they are markup, arrows or menu paths, and never touching protected tags, phoneme spans or SSML."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cadenza.text import normalize
from cadenza.text.lexicon import phoneme_span
from cadenza.text.normalize import protected_spans
from cadenza.text.normalize.markdown import strip_markdown
from cadenza.text.ssml import FrontendTraits, Spoken, looks_like_ssml, parse_ssml

COMPARISONS = [
    ("The temperature is >5 degrees.", "The temperature is greater than five degrees."),
    ("Keep it <10 ms.", "Keep it less than ten milliseconds."),
    ("x < 10 and y > 3", "x less than ten and y greater than three"),
    ("n>0", "n greater than zero"),
    ("10<20", "ten less than twenty"),
    ("if a >= b", "if a greater than or equal to b"),
    ("x<=y", "x less than or equal to y"),
    (">=3 GB free", "greater than or equal to three gigabytes free"),
    ("p < .05", "p less than point zero five"),
    ("x > -1", "x greater than minus one"),
    ("Under <$5 each.", "Under less than five dollars each."),
    ("A > B", "A greater than B"),
    ("It is 5 > x.", "It is five greater than x."),
    ("5a > b", "five a greater than b"),
    ("Let (n+1) > k.", "Let (n+one) greater than k."),
    ("It is <3.", "It is less than three."),  # a full stop after it: a comparison, not a heart
]

KEPT = [
    "Open Settings > Privacy > Cookies.",  # a menu path: the sign is left unread, as before
    "a -> b, a => b, a <=> b, a <> b",  # arrows and the like
    "shift x << y or x >> y",
    "Map<K, V> and List<T>",  # generics (``<T>`` is a protected tag)
    "ab > cd",
]

HEARTS = [
    ("Tom & Jerry <3", "Tom and Jerry <three"),
    ("I <3 you", "I <three you"),
    ("Thanks <3!", "Thanks <three!"),
]

ZH = [
    ("价格>100元。", "价格大于一百元。"),
    ("温度<=5°C。", "温度小于等于五摄氏度。"),
    ("2^10是1024。", "二的十次方是一千零二十四。"),
    ("边长的3^2是9。", "边长的三的平方是九。"),
    ("价格 <abc 汉", "价格 <abc 汉"),  # no comparison: left as written, its spaces too
]


@pytest.mark.parametrize(("text", "read"), COMPARISONS)
def test_comparison_signs_are_read(text, read):
    assert normalize(text) == read


@pytest.mark.parametrize("text", KEPT)
def test_signs_that_are_not_comparisons_stay(text):
    assert normalize(text) == text


@pytest.mark.parametrize(("text", "read"), HEARTS)
def test_a_heart_is_not_less_than_three(text, read):
    assert normalize(text) == read


@pytest.mark.parametrize(("text", "read"), ZH)
def test_chinese_readings(text, read):
    assert normalize(text) == read


@pytest.mark.parametrize(("text", "read"), [
    ("2^10", "two to the power of ten"),
    ("x^2 and 2^3", "x squared and two cubed"),
    ("e^x", "e to the power of x"),
    ("10^-3", "ten to the power of minus three"),
    ("2^0.5", "two to the power of zero point five"),
    ("^5 and ^_^", "^five and ^_^"),  # no base: not a power
])
def test_powers(text, read):
    assert normalize(text) == read


def test_tags_and_phoneme_spans_next_to_signs_pass_unchanged():
    assert normalize("Hello <strong>there</strong> >5") == "Hello <strong>there</strong> greater than five"
    assert normalize("<strong>5</strong> > <strong>3</strong>") == "<strong>five</strong> > <strong>three</strong>"
    assert normalize("<|endofprompt|>x<5") == "<|endofprompt|>x less than five"
    assert normalize("[laughter] >5 [breath]") == "[laughter] greater than five [breath]"
    assert normalize("Read a <b>bold</b> word, 5<6.") == "Read a <b>bold</b> word, five less than six."
    span = phoneme_span("həˈloʊ")
    assert normalize(f"{span} >5 {span}") == f"{span} greater than five {span}"
    for text in ("<|ph:a<b|>", "<|im_start|>", "<laughter>3 > 2</laughter>"):
        spans = [text[a:b] for a, b in protected_spans(text)]
        assert all(s in normalize(text) for s in spans)


def test_ssml_comparisons_arrive_as_text_and_are_read():
    # SSML is parsed before normalisation: an escaped "<" is text; a plain text with "<" is not SSML.
    assert not looks_like_ssml("x < 10 and <strong>y</strong>")
    pieces = parse_ssml("<speak>Only if x &lt; 10 &amp; y &gt;= 3.</speak>", FrontendTraits())
    text = " ".join(p.text for p in pieces if isinstance(p, Spoken))
    assert normalize(text) == "Only if x less than ten and y greater than or equal to three."


def test_a_line_start_sign_before_a_digit_is_not_a_block_quote():
    assert strip_markdown("> quoted\n>5 years\n- >=3 GB") == "quoted\n>5 years\n>=3 GB"
    assert normalize("> quoted\n>5 years\n- >=3 GB") == (
        "quoted\ngreater than five years\ngreater than or equal to three gigabytes")


@pytest.mark.parametrize(("text", "read"), [
    ("\U0001d407\U0001d41e\U0001d425\U0001d425\U0001d428", "Hello"),  # bold
    ("\U0001d43b\U0001d452\U0001d459\U0001d459\U0001d45c \u210e", "Hello h"),  # italic; italic h is U+210E
    ("\U0001d4d7\U0001d4ee\U0001d4f5\U0001d4f5\U0001d4f8", "Hello"),  # bold script
    ("x \u2208 \u211d", "x \u2208 R"),  # double-struck R
    ("\U0001d7cf\U0001d7d0\U0001d7d1 apples", "one hundred twenty-three apples"),  # bold digits
    ("\U0001d6c2 and \U0001d6d1", "\u03b1 and \u03c0"),  # bold Greek -> Greek
])
def test_mathematical_letters_and_digits_become_plain(text, read):
    assert normalize(text) == read


_ALPHABET = st.sampled_from(["<", ">", "=", "-", "<=", ">=", "<3", " ", "x", "y", "ab", "5", "10", ".", "!", "\n",
                             "^", "$", "(", ")", "<b>", "</b>", "<strong>", "<|ph:ə|>", "[laughter]", "价格", "3-2-1"])


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_ALPHABET, max_size=14).map("".join))
@example("I <3 you")
@example("5a > b")
@example("x\n> 5")
def test_idempotent_and_no_digit_left(text):
    once = normalize(text)
    assert normalize(once) == once
    keep, pos = [], 0
    for a, b in protected_spans(once):
        keep.append(once[pos:a])
        pos = b
    assert not re.search(r"[0-9]", "".join(keep) + once[pos:])
