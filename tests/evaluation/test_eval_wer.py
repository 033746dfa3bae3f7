"""WER, the English normaliser, test-list parsing and the report summary (core install only: no ASR models)."""

from __future__ import annotations

import pytest

from cadenza.errors import InputError
from cadenza.evaluation.runner import UtteranceResult, summarize
from cadenza.evaluation.test_list import read_test_list
from cadenza.evaluation.wer import (
    WerScore,
    edit_distance,
    mean_wer,
    normalize_text,
    pooled_wer,
    recognized_words,
    score,
    wer,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("Hello, World!", "hello world"),
    ("  many\tspaces\n\nhere ", "many spaces here"),
    ("You\u2019ll see \u2018it\u2019 \u2014 don't", "you'll see it don't"),  # typographic quotes, em dash
    ("'Quoted' words and O'Brien's book.", "quoted words and o'brien's book"),
    ("A well-known, state\u2011of\u2011the\u2011art idea", "a well known state of the art idea"),
    ("It costs 1,000 dollars, or 3.5% more; 2,50 is not a thousand.", "it costs 1000 dollars or 3.5 more 2 50 is not a thousand"),
    ("Twenty-one or 21?", "twenty one or 21"),  # digits are kept, never spelled out
    ("The U.S.A. and the U.S. economy, e.g. now", "the usa and the us economy eg now"),
    ("Version 3.5.2 at 7 a.m.", "version 3.5.2 at 7 am"),
    ("\uff26\uff55\uff4c\uff4c-width caf\u00e9", "full width caf\u00e9"),  # NFKC, accents kept
    ("...!?", ""),
])
def test_normalize_text(text, expected):
    assert normalize_text(text) == expected


def test_edit_distance_counts_substitutions_deletions_insertions():
    assert edit_distance([], []) == 0
    assert edit_distance("a b c".split(), "a b c".split()) == 0
    assert edit_distance("a b c".split(), []) == 3
    assert edit_distance([], "x y".split()) == 2
    assert edit_distance("the cat sat".split(), "the bat sat".split()) == 1
    assert edit_distance("the cat sat on the mat".split(), "cat sat on a mat today".split()) == 3  # del, sub, ins
    assert edit_distance("a b".split(), "b a".split()) == 2  # no transpositions


def test_wer_normalises_before_counting():
    assert wer("Just by listening, a few minutes a day.", "just by listening a few minutes a day") == 0.0
    assert wer("You'll be able to", "You\u2019ll be able too") == pytest.approx(1 / 4)
    s = score("one two three four", "one three four five six")
    assert (s.errors, s.ref_words) == (3, 4) and s.wer == pytest.approx(0.75)
    assert wer("hi", "hi there you all") == pytest.approx(3.0)  # insertions can push WER above 1
    with pytest.raises(InputError, match="no words"):
        score(" -- ", "anything")


def test_corpus_wer_is_the_mean_of_utterance_wers_and_pooled_is_reported_too():
    scores = [WerScore(errors=1, ref_words=2), WerScore(errors=0, ref_words=18)]
    assert mean_wer(scores) == pytest.approx(0.25)  # (0.5 + 0) / 2: every utterance weighs the same
    assert pooled_wer(scores) == pytest.approx(0.05)  # 1 / 20
    with pytest.raises(InputError):
        mean_wer([])


def _result(uid: str, errors: int, ref_words: int, sim, first, rtf, audio_s: float = 2.0) -> UtteranceResult:
    return UtteranceResult(id=uid, target_text="t", hypothesis="h", wer=errors / ref_words, errors=errors,
                           ref_words=ref_words, similarity=sim, first_chunk_s=first, rtf=rtf, audio_s=audio_s)


def test_summary_figures():
    results = [_result("a", 1, 4, 0.8, 0.2, 0.5), _result("b", 0, 6, None, 0.4, 0.7),
               _result("c", 3, 10, 0.6, 1.0, 0.9, audio_s=3.0)]
    s = summarize(results)
    assert s["n"] == 3
    assert s["wer_mean"] == pytest.approx((0.25 + 0 + 0.3) / 3)
    assert s["wer_pooled"] == pytest.approx(4 / 20)
    assert s["similarity_mean"] == pytest.approx(0.7) and s["similarity_n"] == 2
    assert s["first_chunk_s_mean"] == pytest.approx(1.6 / 3)
    assert s["first_chunk_s_p50"] == pytest.approx(0.4)
    assert s["first_chunk_s_p90"] == pytest.approx(0.4 + 0.8 * 0.6)  # linear interpolation between 0.4 and 1.0
    assert s["rtf_mean"] == pytest.approx(0.7)
    assert s["audio_s_total"] == pytest.approx(7.0)
    scored_only = summarize([_result("a", 0, 3, None, None, None)])
    assert scored_only["first_chunk_s_p50"] is None and scored_only["rtf_mean"] is None
    assert scored_only["similarity_mean"] is None


def test_read_test_list(tmp_path):
    (tmp_path / "prompts").mkdir()
    lst = tmp_path / "meta.lst"
    lst.write_text(
        "\ufeff# Seed-TTS-eval style list\n"
        "utt-1|Prompt words here.|prompts/p1.wav|Say this first.\n"
        "\n"
        "   # an indented comment\n"
        "utt_2\tAnother prompt.\t/abs/p2.wav\tSay this second.\n"
        "utt.3|||No prompt at all.\n"
        "utt+4|Prompt.|prompts/p4.wav|Target four.|gt/utt4.wav\n"
        "utt5||prompts/p5.wav|Prompt without transcript.\r\n",
        encoding="utf-8")
    items = read_test_list(lst)
    assert [i.utt_id for i in items] == ["utt-1", "utt_2", "utt.3", "utt+4", "utt5"]
    assert [i.line for i in items] == [2, 5, 6, 7, 8]
    first = items[0]
    assert first.prompt_text == "Prompt words here." and first.target_text == "Say this first."
    assert first.prompt_wav == tmp_path.resolve() / "prompts" / "p1.wav" and first.target_wav is None
    assert items[1].prompt_wav.as_posix() == "/abs/p2.wav" and items[1].target_text == "Say this second."
    assert items[2].prompt_wav is None and items[2].prompt_text == ""
    assert items[3].target_wav == tmp_path.resolve() / "gt" / "utt4.wav"
    assert items[4].prompt_text == "" and items[4].prompt_wav.name == "p5.wav"
    assert items[4].target_text == "Prompt without transcript."  # the CR of a CRLF line is not part of it


@pytest.mark.parametrize(("content", "message"), [
    ("ok|p|a.wav|fine\n\nbad|only three|fields\n", "line 3: expected 4 fields"),
    ("a|b|c|d|e|f\n", "line 1: expected 4 fields"),
    ("../x|p|a.wav|text\n", "line 1: utt_id '../x'"),
    (".hidden|p|a.wav|text\n", "line 1: utt_id '.hidden'"),
    ("|p|a.wav|text\n", "line 1: utt_id ''"),
    ("u1|p|a.wav|text\n# c\nu1|p|b.wav|text\n", "line 3: utt_id 'u1' already used on line 1"),
    ("u1|p|a.wav|  ...  \n", r"line 1 \(u1\): the target text is empty"),
    ("u1|a transcript||text\n", r"line 1 \(u1\): a prompt text without prompt_wav"),
    ("# nothing\n\n", "has no utterances"),
])
def test_read_test_list_rejects_malformed_lines(tmp_path, content, message):
    lst = tmp_path / "bad.lst"
    lst.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=message):
        read_test_list(lst)


def test_read_test_list_unreadable(tmp_path):
    with pytest.raises(InputError, match="cannot read test list"):
        read_test_list(tmp_path / "missing.lst")
    latin1 = tmp_path / "latin1.lst"
    latin1.write_bytes("u|caf\xe9|a.wav|text\n".encode("latin-1"))
    with pytest.raises(InputError, match="cannot read test list"):
        read_test_list(latin1)


def test_recognized_words_counts_reference_words_heard_in_order():
    assert recognized_words("The man walked home.", "the man walked home") == (4, 4)
    # Extra words around them do not count against the hits (WER would exceed 1 here).
    assert recognized_words("Give me the book.", "so uh give me uh the big book yes yes yes") == (4, 4)
    assert wer("Give me the book.", "so uh give me uh the big book yes yes yes") > 1
    assert recognized_words("Give me the book.", "book the me give") == (1, 4)  # order matters
    assert recognized_words("Hello there.", "") == (0, 2)
    with pytest.raises(InputError):
        recognized_words("...", "anything")


@pytest.mark.parametrize("reference, hypothesis, as_written, read_out", [
    ("It took Ben sixty six minutes.", "It took Ben 66 minutes.", 2, 0),
    ("Our office is on the twenty first floor.", "Our office is on the 21st floor.", 2, 0),
    ("Send it before ten past seven.", "Send it before 10 past 7.", 2, 0),
    ("It costs five dollars, Doctor Lee.", "It costs $5, Dr. Lee.", 3, 0),
    ("I will be there in about seventy minutes.", "I will be there in about 17 minutes.", 1, 1),  # a real error
    ("Please call me back.", "Please call me back.", 0, 0),
])
def test_spell_numbers_reads_both_texts_out_before_counting(reference, hypothesis, as_written, read_out):
    """With ``spell_numbers`` the ASR's digits meet a list's number words on equal terms (both texts go through the
    synthesizer's own text normaliser); a wrong number is still an error, and the default compares as written."""
    assert score(reference, hypothesis).errors == as_written
    assert score(reference, hypothesis, spell_numbers=True).errors == read_out
