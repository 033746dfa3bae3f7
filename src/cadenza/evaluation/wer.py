"""Word error rate: a small English text normaliser and word-level Levenshtein distance.

Seed-TTS-eval scores English with Whisper and ``jiwer`` after stripping punctuation and lower-casing; this module
does the same job without extra dependencies, with rules written down here so that figures can be reproduced:

1. Unicode NFKC (full-width forms, ligatures and non-breaking spaces become their plain forms), then lower case.
2. Typographic apostrophes (``’ ‘ ʼ ` ´``) become ``'``; dashes and hyphens (``‐ ‑ ‒ – — ―``, minus) become ``-``.
3. Thousands separators inside numbers are dropped (``1,000`` -> ``1000``); a decimal point between digits is kept
   (``3.5``). Numbers are NOT spelled out: ``twenty`` and ``20`` are different words, so write targets the way the
   ASR writes them (Whisper mostly uses digits for years, amounts and times), or score with ``spell_numbers``:
   both texts then first go through Cadenza's own English text normaliser (``cadenza.text.normalize``: ``66`` ->
   ``sixty-six``, ``21st`` -> ``twenty-first``, ``$5`` -> ``five dollars``, ``Dr.`` -> ``doctor``), the one that decides
   what the synthesizer says, so a list written in words is not charged for the ASR's digits. Off by default
   (Seed-TTS-eval's convention, and published figures, compare the texts as written).
4. Dotted abbreviations of single letters are joined (``u.s.a.`` -> ``usa``, ``e.g.`` -> ``eg``).
5. Hyphens split words (``well-known`` -> ``well known``: the ASR writes either form). An apostrophe inside a word
   is kept (``you'll``, ``o'clock``); quotes around a word are removed.
6. Every other punctuation mark or symbol becomes a space, and runs of white space collapse to one.

The corpus figure is the *mean of per-utterance WERs* (Seed-TTS-eval's convention: every utterance weighs the
same); the pooled WER (all errors / all reference words) is reported beside it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cadenza.errors import InputError
from cadenza.text.normalize import normalize

_APOSTROPHES = str.maketrans({c: "'" for c in "\u2019\u2018\u02bc\u0060\u00b4\u2032"})
_DASHES = str.maketrans({c: "-" for c in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"})
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_DECIMAL_POINT = re.compile(r"(?<=\d)\.(?=\d)")
_DECIMAL_MARK = "\x00"  # a placeholder that survives the punctuation pass (never in NFKC-normalised text)
_DOTTED_LETTERS = re.compile(r"(?<![\w.])[^\W\d_](?:\.[^\W\d_])+\.?(?!\w)")  # u.s.a. / U.S.A / e.g.
_EDGE_APOSTROPHES = re.compile(r"(?<![\w])'+|'+(?![\w])")


def normalize_text(text: str) -> str:
    """Normalise English text for WER (the rules are in the module docstring). Returns space-separated words."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.translate(_APOSTROPHES).translate(_DASHES)
    text = _THOUSANDS.sub("", text)
    text = _DECIMAL_POINT.sub(_DECIMAL_MARK, text)
    text = _DOTTED_LETTERS.sub(lambda m: m.group(0).replace(".", "") + " ", text)
    text = _EDGE_APOSTROPHES.sub(" ", text)  # quotes, not contractions: "'hello'" -> "hello", "you'll" stays
    chars = []
    for ch in text:
        if ch == "'" or ch == _DECIMAL_MARK:
            chars.append(ch)
        elif unicodedata.category(ch)[0] in "PSZC":  # punctuation, symbols, separators, control characters
            chars.append(" ")
        else:
            chars.append(ch)
    return " ".join("".join(chars).replace(_DECIMAL_MARK, ".").split())


def words(text: str) -> list[str]:
    """The normalised words of ``text``."""
    return normalize_text(text).split()


def edit_distance(reference: Sequence, hypothesis: Sequence) -> int:
    """Levenshtein distance between two sequences (words, characters, label ids): substitutions + deletions +
    insertions (unit costs)."""
    previous = list(range(len(hypothesis) + 1))  # distance from reference[:0] to hypothesis[:j]
    for i, ref_word in enumerate(reference, start=1):
        current = [i] + [0] * len(hypothesis)
        for j, hyp_word in enumerate(hypothesis, start=1):
            current[j] = min(previous[j] + 1,  # deletion of ref_word
                             current[j - 1] + 1,  # insertion of hyp_word
                             previous[j - 1] + (ref_word != hyp_word))  # match or substitution
        previous = current
    return previous[-1]


def recognized_words(reference: str, hypothesis: str) -> tuple[int, int]:
    """``(hits, ref_words)``: how many normalised reference words the hypothesis contains in order (longest common
    subsequence). Unlike WER, words the ASR adds around them (hallucinated filler) do not lower the count: it answers
    "did the listener hear these words". Raises ``InputError`` if the reference has no words."""
    ref, hyp = words(reference), words(hypothesis)
    if not ref:
        raise InputError(f"the reference text {reference!r} has no words after normalisation")
    previous = [0] * (len(hyp) + 1)
    for ref_word in ref:
        current = [0] * (len(hyp) + 1)
        for j, hyp_word in enumerate(hyp, start=1):
            current[j] = previous[j - 1] + 1 if ref_word == hyp_word else max(previous[j], current[j - 1])
        previous = current
    return previous[-1], len(ref)


@dataclass(frozen=True)
class WerScore:
    """One utterance: ``errors`` edits against ``ref_words`` normalised reference words."""

    errors: int
    ref_words: int

    @property
    def wer(self) -> float:
        return self.errors / self.ref_words


def score(reference: str, hypothesis: str, *, spell_numbers: bool = False) -> WerScore:
    """Normalise both texts and count word errors; ``spell_numbers``: both first read out by the text normaliser
    (numbers, amounts, times and abbreviations in words). Raises ``InputError`` if the reference has no words."""
    if spell_numbers:
        reference, hypothesis = normalize(reference, lang="en"), normalize(hypothesis, lang="en")
    ref = words(reference)
    if not ref:
        raise InputError(f"the reference text {reference!r} has no words after normalisation")
    return WerScore(errors=edit_distance(ref, words(hypothesis)), ref_words=len(ref))


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of one utterance (can exceed 1 when the hypothesis has many extra words)."""
    return score(reference, hypothesis).wer


def mean_wer(scores: Iterable[WerScore]) -> float:
    """Mean of per-utterance WERs (the Seed-TTS-eval corpus figure)."""
    values = [s.wer for s in scores]
    if not values:
        raise InputError("no utterances to average")
    return sum(values) / len(values)


def pooled_wer(scores: Iterable[WerScore]) -> float:
    """All errors over all reference words (long utterances weigh more)."""
    scores = list(scores)
    if not scores:
        raise InputError("no utterances to pool")
    return sum(s.errors for s in scores) / sum(s.ref_words for s in scores)
