"""A phoneme model cannot perform CosyVoice 2's inline tags or HTML markup: they are not read aloud as words
("Hello <strong>there</strong>." was spoken "hello strong there slash strong"), their words stay, phoneme spans are
still read symbol for symbol, and a segment of markup alone is not a segment."""

from __future__ import annotations

import pytest

from cadenza.text import split_text
from cadenza.text.lexicon import phoneme_span
from cadenza.text.phonemes import PhonemeTable, PhonemeTokenizer, drop_tags
from cadenza.text.qwen_tokenizer import COSYVOICE2_SPECIAL_TOKENS, ENDOFTEXT

SYMBOLS = ("_", "^", "$", " ", ",", ".", "?", "!", ";", ":", "ˈ", "ˌ", "ː", "a", "b", "d", "e", "f", "h", "i", "j",
           "k", "l", "m", "n", "o", "p", "s", "t", "u", "v", "w", "z", "æ", "ð", "ŋ", "ɑ", "ɔ", "ə", "ɚ", "ɛ", "ɜ",
           "ɡ", "ɪ", "ɹ", "ɾ", "ʃ", "ʊ", "ʌ", "ʒ", "θ", "ᵻ", "r", "c", "ç", "x", "ʔ", "ɐ", "ɒ", "ɬ", "ʲ")


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("espeakng_loader")
    return PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS))


@pytest.mark.parametrize(("text", "plain"), [
    ("Hello <strong>there</strong>.", "Hello there."),
    ("Hello [laughter] there.", "Hello there."),
    ("Hello [breath] world", "Hello world"),
    ("Hello<|endoftext|>world", "Hello world"),
    ("<laughter>So funny</laughter>, she said.", "So funny, she said."),
    ("The <b>bold</b> move.", "The bold move."),
    ("Line one<br/>line two.", "Line one line two."),
    ('See <a href="https://x.org/a">the page</a> <span class=note>now</span>.', "See the page now."),
])
def test_markup_is_not_read(tokenizer, text, plain):
    assert tokenizer.encode(text) == tokenizer.encode(plain)


def test_every_cosyvoice2_tag_is_dropped():
    for tag in (*COSYVOICE2_SPECIAL_TOKENS, ENDOFTEXT, "<|im_start|>", "<|custom|>"):
        assert drop_tags(f"Yes {tag} no") == "Yes no", tag


def test_what_is_not_markup_stays():
    for text in ("x [applause] y", "Map<K, V>", "a <three", "Tom and Jerry", "<|ph", "a <> b"):
        assert drop_tags(text) == text


def test_phoneme_spans_are_still_read(tokenizer):
    span = phoneme_span("həlˈoʊ")
    ids = tokenizer.encode(f"{span} <strong>there</strong>.")
    assert ids == tokenizer.encode(f"{span} there.")
    assert [tokenizer.table.symbols[i] for i in ids][:6] == list("həlˈoʊ")


def test_a_segment_of_markup_alone_is_not_a_segment(tokenizer):
    assert tokenizer.encode("<strong></strong> [laughter]") == []
    cut = split_text("Hello. [laughter]\n<strong></strong>", 100, count_tokens=tokenizer.count_piece,
                     one_sentence=True)
    assert cut == ["Hello."]
    # A counter that reads every tag (BPE) keeps them, as before.
    assert split_text("Hello. [laughter]", 100, count_tokens=len, one_sentence=True) == ["Hello.", "[laughter]"]
