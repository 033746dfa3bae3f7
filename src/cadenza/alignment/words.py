"""The words of an input text and the phonemes each is spoken with: what word timestamps are given for.

A word is a run of non-space characters of the text as the caller wrote it (``"$5,"`` is one word), minus inline
markup that is not spoken (CosyVoice 2's ``[laughter]`` / ``<strong>`` tags, VoxCPM 2's leading ``(description)``).
Its phonemes are those of its normalised form (``"$5,"`` -> "five dollars"), from espeak-ng as cadenza-tiny reads
them (``cadenza.text.phonemes``), without stress marks, punctuation and spaces: the units the aligner places.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cadenza.text import normalize
from cadenza.text.phonemes import phonemize

_MARKUP = re.compile(r"\[[^\]\s]*\]|</?[A-Za-z][^<>]*>")  # [laughter], <strong>, </strong>
_DESCRIPTION = re.compile(r"^\s*\([^()]*\)")  # VoxCPM 2 voice design prefix
_WORD = re.compile(r"\S+")
_NOT_UNITS = frozenset("ˈˌ _^$!'(),-.:;?\"#↓")  # stress marks (a property of the next units), pauses, punctuation


@dataclass(frozen=True)
class Word:
    """One input word: its text, its character span in the input, and the phoneme units it is spoken with."""

    text: str
    start_char: int
    end_char: int
    units: tuple[str, ...]


def without_markup(text: str) -> str:
    """``text`` with its inline markup (tags such as ``<strong>``, SSML's, ``[laughter]``) turned into as many
    spaces: character positions stay those of ``text``, and no tag is read as a word."""
    return _MARKUP.sub(lambda m: " " * len(m.group()), text)


def spoken_words(text: str, language: str = "en-us", description: bool = True) -> list[Word]:
    """The words of ``text`` (runs of non-space characters with something to say) with their phoneme units (none
    when espeak-ng has no phonemes for them, e.g. a script its language does not read).

    description: strip a leading ``(description)`` (VoxCPM 2 voice design) before reading words.
    """
    cleaned = without_markup(text)
    if description and (m := _DESCRIPTION.match(cleaned)):
        cleaned = " " * m.end() + cleaned[m.end():]
    words = []
    for m in _WORD.finditer(cleaned):
        spoken = normalize(m.group())
        if any(c.isalnum() for c in spoken):  # "--" or "!" alone is no word; "&" ("and") is
            units = tuple(s for s in phonemize(spoken, language) if s not in _NOT_UNITS)
            words.append(Word(m.group(), m.start(), m.end(), units))
    return words
