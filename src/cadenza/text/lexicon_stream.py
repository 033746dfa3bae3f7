"""A pronunciation lexicon over text that arrives in pieces (a WebSocket session, an upstream LLM's tokens).

::

    stream = LexiconStream(Lexicon.from_json([{"word": "New York", "respelling": "noo york"}]))
    stream.feed("I love New ")     # -> "I love "      ("New" may start "New York": held back)
    stream.feed("York, today ")    # -> "noo york, "   ("today" may start an entry's two words: held back)
    stream.flush()                 # -> "today "

What comes out, joined, is exactly ``lexicon.apply`` of the whole text, however the text was cut: a piece goes out
only up to where no later text can change a replacement. That is before the last ``n - 1`` words when the longest
entry has ``n`` words and the text so far ends with a separator (a space or a CJK full stop or comma), ``n`` when it
ends inside a word (the word may still grow: ``Cadenza`` -> ``Cadenzas``), and never inside a replacement, a
protected tag (``<|ph:...|>``, ``[laughter]``) or a leading ``(description)`` that is not closed yet. So speech
waits for at most the longest entry's words; Chinese text, written without spaces, waits for its next punctuation.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from cadenza.text.lexicon import Lexicon

_SEPARATOR = r"\s。！？，；：、"
_WORDS = re.compile(f"[^{_SEPARATOR}]+")


class LexiconStream:
    """``feed(piece) -> text settled so far`` (possibly ``""``), ``flush() -> the rest`` (the text has ended).

    ``phonemes``: as ``Lexicon.apply`` (the model's phoneme symbols, or None for models that read text, where a
    phoneme entry that matches raises ``InputError`` naming its word)."""

    def __init__(self, lexicon: Lexicon, phonemes: Collection[str] | None = None) -> None:
        self.lexicon, self.phonemes = lexicon, phonemes
        self.longest = max((len(_WORDS.findall(e.word)) for e in lexicon.entries), default=1)
        self.pending = ""
        self.started = False  # text with something in it went out: no leading (description) any more

    def feed(self, piece: str) -> str:
        self.pending += piece
        return self._take(self._cut())

    def flush(self) -> str:
        return self._take(len(self.pending))

    def _take(self, cut: int) -> str:
        if cut <= 0:
            return ""
        ready, self.pending = self.pending[:cut], self.pending[cut:]
        out = self.lexicon.apply(ready, self.phonemes, description=not self.started)
        self.started = self.started or bool(ready.strip())
        return out

    def _cut(self) -> int:
        """How much of ``pending`` no later text can change."""
        text = self.pending
        head = text.lstrip()
        if not self.started and head.startswith("(") and ")" not in head:
            return 0  # maybe a description (VoxCPM 2), protected once it is closed
        starts = [m.start() for m in _WORDS.finditer(text)]
        keep = self.longest - 1 if text[-1:] and re.match(f"[{_SEPARATOR}]", text[-1]) else self.longest
        if keep == 0:
            cut = len(text)
        elif len(starts) < keep:
            return 0
        else:
            cut = starts[-keep]
        # Never inside a replacement, a protected tag or a control tag not closed yet (phonemes may hold spaces):
        # back to the start of the word it starts in (a separator before it then reads as the text's start did, for
        # the entries' word boundaries), until nothing straddles the cut.
        spans = self.lexicon.match_spans(text, description=not self.started)
        opened = text.rfind("<|")
        if opened >= 0 and text.find("|>", opened) < 0:
            spans.append((opened, len(text) + 1))
        moved = True
        while moved and cut > 0:
            moved = False
            for a, b in spans:
                if a < cut < b:
                    cut = max((s for s in starts if s <= a), default=0)
                    moved = True
        return cut
