"""How long a text takes to say, estimated from its letters: bounds the work of a request before any of it is done.

The estimate is script-aware and deliberately plain (no model): CJK characters are about one syllable each (~4.5
per second in read speech), other letters and digits about 12 per second (150 words per minute of 4.7 letters).
It is used on *normalised* text, so numbers already read as words ("9999" -> "nine thousand nine hundred ...").
"""

from __future__ import annotations

import re

SECONDS_PER_CJK = 0.22
LETTERS_PER_SECOND = 12.0
# Han, kana, Hangul syllables, CJK compatibility ideographs.
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_LETTER = re.compile(r"[^\W_]")


def estimate_speech_seconds(text: str) -> float:
    """Seconds of speech ``text`` (normalised) makes at an ordinary reading rate."""
    n_cjk = len(_CJK.findall(text))
    n_letters = len(_LETTER.findall(text)) - n_cjk
    return n_cjk * SECONDS_PER_CJK + n_letters / LETTERS_PER_SECOND
