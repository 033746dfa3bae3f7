"""Language of a stretch of text, decided by script.

Only two scripts carry a language here: Han characters (CJK ideographs) -> ``"zh"`` and Latin letters (ASCII and
Latin-1/Extended accented letters) -> ``"en"``. Digits, punctuation, symbols, spaces, protected tags and letters of
other scripts carry none.

Rule for a number or symbol (an *entity*): it is read in the language of the **nearest** script character outside
it — the closest Han or Latin character to its left or right (distance counted in characters from the entity's
edge). On a tie the right-hand neighbour wins (a number usually modifies what follows: ``"苹果 3 apples"`` ->
English). With no script character anywhere, Chinese is assumed when the text has CJK punctuation or full-width
forms, English otherwise.
Examples: ``"我有3个apple"`` -> 三 (有 and 个 are adjacent); ``"I have 3个苹果"`` -> 三 (个 at distance 1 beats
"e" at 2); ``"I have 3 apples 苹果"`` -> three; ``"苹果 3 apples"`` -> three (tie, right wins).
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right

HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff"
LATIN = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff"
HAN_RE = re.compile(f"[{HAN}]")
_RUNS = re.compile(f"(?P<zh>[{HAN}]+)|(?P<en>[{LATIN}]+)")
_CJK_PUNCT = re.compile(r"[\u3000-\u303f\uff00-\uffef]")

LANGUAGES = ("en", "zh")


def is_han(ch: str) -> bool:
    return bool(ch) and HAN_RE.match(ch) is not None


def default_language(text: str) -> str:
    """Language for a text without any Han or Latin letter: zh if it has CJK punctuation/full-width forms, else en."""
    return "zh" if _CJK_PUNCT.search(text) else "en"


def detect_language(text: str) -> str:
    """Dominant language of ``text``: zh when Han characters outnumber Latin words, else en (the default rule
    applies when there are neither)."""
    han = latin = 0
    for m in _RUNS.finditer(text):
        if m.lastgroup == "zh":
            han += m.end() - m.start()
        else:
            latin += 1
    if not han and not latin:
        return default_language(text)
    return "zh" if han >= latin else "en"


class ScriptIndex:
    """Positions of the Han and Latin runs of a text, for nearest-neighbour language look-ups.

    Build it on the text with protected spans blanked out (same length), so tag names like ``[laughter]`` do not
    count as English.
    """

    def __init__(self, text: str) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._langs: list[str] = []
        for m in _RUNS.finditer(text):
            self._starts.append(m.start())
            self._ends.append(m.end())
            self._langs.append(m.lastgroup or "en")
        self.default = default_language(text)

    def nearest(self, start: int, end: int) -> str:
        """Language of the nearest script character outside ``[start, end)``; ties go right."""
        left = bisect_left(self._starts, start) - 1  # last run starting before the entity
        right = bisect_right(self._ends, end)  # first run ending after the entity
        d_left = start - (min(self._ends[left], start) - 1) if left >= 0 else None
        d_right = max(self._starts[right], end) - end + 1 if right < len(self._starts) else None
        if d_left is None and d_right is None:
            return self.default
        if d_right is not None and (d_left is None or d_right <= d_left):
            return self._langs[right]
        return self._langs[left]
