"""Character vocabulary of the tokenizer's CTC head: id 0 = CTC blank, 1 = unknown, then one id per character.

Built from the training transcripts (characters seen at least ``min_count`` times, most frequent first); works for
alphabetic and logographic scripts alike. Whitespace runs become one space; with ``lowercase`` (default) case is
folded so that the codes are not asked to carry it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

from cadenza.errors import InputError

BLANK = 0
UNKNOWN = 1
_SPACES = re.compile(r"\s+")


class CharVocab:
    """Maps transcripts to CTC label ids and back."""

    def __init__(self, chars: Sequence[str], lowercase: bool = True) -> None:
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise InputError("CharVocab needs distinct single characters")
        self.chars = list(chars)
        self.lowercase = lowercase
        self._ids = {c: i + 2 for i, c in enumerate(self.chars)}

    @classmethod
    def from_texts(cls, texts: Iterable[str], min_count: int = 1, lowercase: bool = True) -> CharVocab:
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(cls._normalise(text, lowercase))
        chars = [c for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n >= min_count]
        if not chars:
            raise InputError("no characters to build a vocabulary from: every transcript is empty")
        return cls(chars, lowercase)

    @staticmethod
    def _normalise(text: str, lowercase: bool) -> str:
        text = _SPACES.sub(" ", text).strip()
        return text.lower() if lowercase else text

    def __len__(self) -> int:
        """Number of classes including blank and unknown."""
        return len(self.chars) + 2

    def encode(self, text: str) -> list[int]:
        return [self._ids.get(c, UNKNOWN) for c in self._normalise(text, self.lowercase)]

    def decode(self, ids: Iterable[int]) -> str:
        """Label ids (no blanks expected) -> text; the unknown id prints as U+FFFD."""
        return "".join(self.chars[i - 2] if i >= 2 else "\ufffd" for i in ids if i != BLANK)

    def to_dict(self) -> dict:
        return {"chars": self.chars, "lowercase": self.lowercase}

    @classmethod
    def from_dict(cls, data: dict) -> CharVocab:
        return cls(list(data["chars"]), bool(data.get("lowercase", True)))
