"""Split long text into segments that each fit a token budget, cutting where a reader would pause.

Cut preference: line breaks and sentence ends (``。！？；… .!?;``, with closing quotes/brackets kept on the left), then
clause marks (``，、,:：``), then spaces, then between CJK characters, and only as a last resort between any two
characters. A cut is never placed inside a protected tag (``[laughter]``, ``<|endofprompt|>``, a VoxCPM 2 leading
``(description)``, a short ``<strong>…</strong>`` pair), a number (``3.14``, ``1,000``, ``$5``, ``3:45``, ``50%``), an
abbreviation with the word it introduces (``Dr. Smith``, ``e.g. this``), initials (``J. K.``), an initialism before a
lower-case word (``the U.S.A. border``) or a capitalised one that seldom starts a sentence (``the U.S. Army``), or a
URL / e-mail.

The pieces are then packed into segments by dynamic programming: every segment within ``max_tokens``, few segments,
even sizes, and cheap cuts preferred (cost = squared unused fraction of the budget per segment + a penalty per cut
that grows from sentence to clause to space to character, plus a smaller one for each paragraph break a segment
spans, so paragraphs stay apart unless joining them evens the sizes out). Segments are exact slices of the input with the
whitespace at the cut removed — no character is added, dropped or changed — except that a segment made only of
punctuation and symbols (possible only under a tiny budget), or one the given counter reads as no tokens (a phoneme
model's counter: markup alone, ``[laughter]``), is dropped. A single unsplittable atom longer than the
budget (a very long tag) becomes its own, over-budget segment; a number, URL or abbreviation that does not fit the
budget on its own is cut like ordinary text (the budget wins over keeping it whole).
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Callable

from cadenza.errors import InputError, TextError
from cadenza.text.normalize.detect import HAN, LANGUAGES
from cadenza.text.normalize.tags import TAG_RE, protected_spans

_CLOSERS = "\"'”’」』）)】》〉]"
_SENTENCE = re.compile(rf"(?:[。！？!?；;…]|\.)+[{re.escape(_CLOSERS)}]*")
_CLAUSE = re.compile(rf"[，、,：:]+[{re.escape(_CLOSERS)}]*")
_SPACE = re.compile(r"\s+")
_NEWLINE = re.compile(r"\n+")
_HAN_RE = re.compile(f"[{HAN}\u3000-\u303f\uff00-\uffef]")
_AFTER_PERIOD = re.compile(rf"\s|\Z|[{HAN}\u3000-\u303f\uff00-\uffef{re.escape(_CLOSERS)}]")

_NUMBER = re.compile(r"[-−+]?(?:US\$|HK\$|[$€£¥￥])?[0-9]+(?:[.,:/\-–][0-9]+)*(?:\s?[%‰])?")
_URL = re.compile(r"https?://\S+|www\.\S+|(?<![\w.+-])[\w.+-]{1,64}@[\w-]+\.[\w.]+")  # anchored: linear time
_TITLES = r"Dr|Mr|Mrs|Ms|Prof|Mt|Gen|Capt|Lt|Sgt|Col|Gov|Sen|Rev|Hon|Fig|Vol|No|no|vs|approx|e\.g|i\.e|E\.g|I\.e|[A-Z]"
_FINALS = r"etc|Jr|Sr|Inc|Ltd|Corp|Co|Ave|Blvd|Rd|Dept|St|U\.S|U\.K|a\.m|p\.m"
_TITLE_ABBR = re.compile(rf"(?<![A-Za-z.])(?:{_TITLES})\.\s*(?=\w)")
_FINAL_ABBR = re.compile(rf"(?<![A-Za-z.])(?:{_FINALS})\.(?!\s*\Z|\s*\n|\s+[A-Z{HAN}])\s*(?=\w)")
_INITIALISM = re.compile(r"(?<![\w.])(?:[A-Za-z]\.){2,}\s+(?=[a-z])")  # "the U.S.A. border": no sentence ends there
# Words that start sentences far more often than they follow a capitalised initialism: "...to the U.S. Then we left."
# ends a sentence, "The U.S. Army arrived." does not (it was cut into "The U.S." / "Army arrived ...").
_STARTERS = ("The|A|An|It|Its|I|We|He|She|They|You|This|That|These|Those|There|Then|But|And|So|Or|Yet|In|On|At|"
             "After|Before|When|While|If|As|My|Our|His|Her|Their|Your|What|Why|How|Who|Where|Yes|No|Now|Today|"
             "However|Also|Later|Meanwhile|Since|Because|Although|Still|Soon|Here|One|Some|Many|Most|All|Every")
_INITIALISM_NAME = re.compile(rf"(?<![\w.])(?:[A-Z]\.){{2,}}\s+(?=[A-Z])(?!(?:{_STARTERS})\b)")
_PAIRS = re.compile(r"<strong>.*?</strong>|<laughter>.*?</laughter>", re.DOTALL)
_ESTIMATE = re.compile(rf"{TAG_RE.pattern}|(?P<word>[A-Za-z\u00c0-\u024f]+)|\S")

# Cut levels (lower = better place to cut) and the packing penalty of a cut at each level.
NEWLINE, SENTENCE, CLAUSE, SPACE, CJK_CHAR, ANY_CHAR = range(6)
_PENALTY = (0.0, 0.0, 0.15, 0.5, 1.0, 3.0)
_PARAGRAPH_JOIN = 0.3  # cost of a paragraph break inside a segment (an empty segment costs 1.0)


def estimate_tokens(text: str, lang: str | None = None) -> int:
    """Conservative token count without a tokenizer: one per CJK character, digit, punctuation mark and tag, one per
    started 4 letters of a Latin word. With ``lang="zh"`` every non-space character counts one (CosyVoice's rule)."""
    if lang == "zh":
        return len(TAG_RE.sub("#", "".join(text.split())))
    total = 0
    for m in _ESTIMATE.finditer(text):
        word = m.group("word")
        total += (len(word) + 3) // 4 if word else 1
    return total


def _only_punctuation(s: str) -> bool:
    return all(unicodedata.category(c)[0] in "PSZ" or c.isspace() for c in s)


class _Splitter:
    """One call of :func:`split_text`: cut candidates, forbidden positions, recursive pieces, packing."""

    def __init__(self, text: str, max_tokens: int, count: Callable[[str], int]) -> None:
        self.text, self.max, self._counter = text, max_tokens, count
        self._counts: dict[str, int] = {}  # a sentence is counted by the pieces, the packer and the fit alike
        n = len(text)
        self.blocked = bytearray(n + 1)  # 1 = a cut at this position would break an atom
        for a, b in self._atoms():
            self.blocked[a + 1 : b] = b"\x01" * max(0, b - a - 1)
        self.level: dict[int, int] = {}
        self._candidates()
        self.by_level: list[list[int]] = [[] for _ in _PENALTY]
        for pos, lv in sorted(self.level.items()):
            self.by_level[lv].append(pos)

    def count(self, text: str) -> int:
        """Tokens of ``text`` by the caller's counter, each distinct string once (a phoneme counter runs espeak-ng)."""
        tokens = self._counts.get(text)
        if tokens is None:
            tokens = self._counts[text] = self._counter(text)
        return tokens

    def _atoms(self):
        """Spans no cut may enter. Tags (and short ``<strong>`` pairs) always; numbers, URLs and abbreviations with
        their next word only while the (overlap-merged) span fits the budget — otherwise the budget wins."""
        text = self.text
        yield from protected_spans(text)
        for m in _PAIRS.finditer(text):
            if self.count(m.group()) <= self.max:
                yield m.span()
        soft = [m.span() for rx in (_NUMBER, _URL) for m in rx.finditer(text)]
        soft += [(m.start(), m.end() + 1) for rx in (_TITLE_ABBR, _FINAL_ABBR, _INITIALISM, _INITIALISM_NAME)
                 for m in rx.finditer(text)]
        chains: list[list[int]] = []
        for a, b in sorted(soft):
            if chains and a < chains[-1][1]:
                chains[-1][1] = max(chains[-1][1], b)
            else:
                chains.append([a, b])
        for a, b in chains:
            if self.count(text[a:b].strip()) <= self.max:
                yield a, b

    def _add(self, pos: int, level: int) -> None:
        if 0 < pos < len(self.text) and not self.blocked[pos] and level < self.level.get(pos, 99):
            self.level[pos] = level

    def _candidates(self) -> None:
        text = self.text
        for m in _NEWLINE.finditer(text):
            self._add(m.start(), NEWLINE)
        for m in _SENTENCE.finditer(text):
            body = m.group().rstrip(_CLOSERS)
            if set(body) == {"."} and len(body) < 3 and not _AFTER_PERIOD.match(text, m.end()):
                continue  # "example.com", "3.14", "a.m" — not a sentence end
            self._add(m.end(), SENTENCE)
        for m in _CLAUSE.finditer(text):
            self._add(m.end(), CLAUSE)
        for m in _SPACE.finditer(text):
            self._add(m.start(), SPACE)
        for i in range(1, len(text)):
            a, b = text[i - 1], text[i]
            if a.isspace() or b.isspace() or unicodedata.category(b)[0] == "M" or "\u200d" in (a, b):
                continue
            if "\ufe00" <= b <= "\ufe0f" or "\U0001f3fb" <= b <= "\U0001f3ff":
                continue  # variation selectors and skin tones stay with their emoji
            self._add(i, CJK_CHAR if _HAN_RE.match(a) or _HAN_RE.match(b) else ANY_CHAR)

    def _tokens(self, a: int, b: int) -> int:
        return self.count(self.text[a:b].strip())

    def pieces(self, a: int, b: int, level: int) -> list[tuple[int, int]]:
        """``[a, b)`` split into pieces that fit the budget where possible: first at sentence ends; a sentence that is
        still too long offers all its clause and space cuts at once (the packer picks among them by cost), and only
        words still too long are cut between characters."""
        if not self.text[a:b].strip():
            return []
        if level > ANY_CHAR or self._tokens(a, b) <= self.max:
            return [(a, b)]
        top = level if level <= SENTENCE else max(level, SPACE)
        cuts = sorted(
            c
            for lv in range(top + 1)
            for c in self.by_level[lv][bisect_right(self.by_level[lv], a) : bisect_left(self.by_level[lv], b)]
        )
        if not cuts:
            return self.pieces(a, b, top + 1)
        out: list[tuple[int, int]] = []
        prev = a
        for c in [*cuts, b]:
            out += self.pieces(prev, c, top + 1)
            prev = c
        return out

    def pack(self, units: list[tuple[int, int]], one_sentence: bool = False) -> list[tuple[int, int]]:
        """Group consecutive pieces into segments (DP over the cost described in the module docstring); with
        ``one_sentence`` no segment spans a sentence end or line break.

        Segment sizes inside the DP are summed from the pieces (a piece counted with its leading whitespace, the first
        one without), so the counter runs once per piece; every chosen segment is then counted for real and re-cut
        greedily in the rare case that joining pieces cost more tokens than their sum.
        """
        n = len(units)
        text = self.text
        bare = [self.count(text[a:b].strip()) for a, b in units]
        full = [0] + [self.count(text[a:b].rstrip()) for a, b in units]
        for k in range(1, n + 1):
            full[k] += full[k - 1]
        cut = [0.0] + [_PENALTY[self.level.get(a, ANY_CHAR)] for a, _ in units[1:]]  # cost of a cut before unit i
        joins = [0.0] + [_PARAGRAPH_JOIN if self.level.get(a) == NEWLINE else 0.0 for a, _ in units[1:]]
        best = [0.0] + [float("inf")] * n
        back = [0] * (n + 1)
        limit = self.max
        for j in range(1, n + 1):
            paragraphs = 0.0  # paragraph breaks inside the candidate segment: keep paragraphs apart when it is cheap
            for i in range(j - 1, -1, -1):
                if i < j - 1:
                    if one_sentence and self.level.get(units[i + 1][0], ANY_CHAR) <= SENTENCE:
                        break  # joining units i and i + 1 would put a sentence end inside the segment
                    paragraphs += joins[i + 1]
                tokens = bare[i] + full[j] - full[i + 1]
                if tokens > limit and i < j - 1:
                    break  # adding more pieces only grows the segment
                slack = (limit - tokens) / limit if tokens < limit else 0.0
                cost = best[i] + slack * slack + cut[i] + paragraphs
                if cost < best[j]:
                    best[j], back[j] = cost, i
        bounds = []
        j = n
        while j > 0:
            bounds.append((back[j], j))
            j = back[j]
        groups: list[tuple[int, int]] = []
        for i, j in reversed(bounds):
            groups += self._fit(units[i:j])
        return groups

    def _fit(self, units: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The span of ``units`` if it fits for real, else the span cut where its two sides are most even (a cheaper
        cut level preferred), each side fitted again: a segment filled to the budget and a scrap after it ("... a
        thermos of sweet" / "tea.") is a sentence read as two, one of them a single word."""
        if len(units) == 1 or self._tokens(units[0][0], units[-1][1]) <= self.max:
            return [(units[0][0], units[-1][1])]
        best, cut = float("inf"), 1
        for k in range(1, len(units)):
            sides = max(self._tokens(units[0][0], units[k - 1][1]), self._tokens(units[k][0], units[-1][1]))
            cost = sides / self.max + _PENALTY[self.level.get(units[k][0], ANY_CHAR)]
            if cost < best:
                best, cut = cost, k
        return self._fit(units[:cut]) + self._fit(units[cut:])


def split_text(
    text: str,
    max_tokens: int,
    count_tokens: Callable[[str], int] | None = None,
    lang: str | None = None,
    one_sentence: bool = False,
) -> list[str]:
    """Cut ``text`` into segments of at most ``max_tokens`` tokens each (counted by ``count_tokens``, default
    :func:`estimate_tokens`), preferring sentence, then clause, then space boundaries; see the module docstring.

    ``one_sentence``: every sentence end and line break is a cut, so no segment holds more than one sentence (for
    an LM trained on one sentence at a time, which ends its speech at the first sentence end it may).

    ``lang`` only selects the default estimate (``"zh"``: one token per character); boundaries are found by script.
    Returns ``[]`` for blank or punctuation-only text.
    """
    if not isinstance(text, str):
        raise TextError(f"text must be a string, not {type(text).__name__}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InputError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if lang is not None and lang not in LANGUAGES:
        raise InputError(f"unsupported language {lang!r}; use one of {LANGUAGES} or None")
    if count_tokens is not None and not callable(count_tokens):
        raise InputError("count_tokens must be a callable taking a string and returning an int")
    count = count_tokens if count_tokens is not None else (lambda s: estimate_tokens(s, lang))
    if _only_punctuation(text):
        return []
    splitter = _Splitter(text, max_tokens, count)
    if one_sentence:  # the sentences first, each then cut to the budget as a text of its own would be
        ends = sorted(splitter.by_level[NEWLINE] + splitter.by_level[SENTENCE])
        units = [u for a, b in zip([0, *ends], [*ends, len(text)]) for u in splitter.pieces(a, b, SENTENCE)]
    else:
        units = splitter.pieces(0, len(text), SENTENCE)
    segments = [text[a:b].strip() for a, b in splitter.pack(units, one_sentence)]
    segments = [s for s in segments if s and not _only_punctuation(s)]
    # A segment the model's counter reads as nothing (a phoneme model: markup alone, "[laughter]") is not spoken.
    return segments if count_tokens is None else [s for s in segments if splitter.count(s) > 0]


_FINAL_MARKS = "。！？；…"  # a sentence end nothing that follows can undo (unlike "." before "14" in "3.14")


def complete_prefix(text: str) -> int:
    """Where the complete sentences of a text still being written end (0: none yet): the last sentence end or line
    break that the text after it confirms (a space, a line break or more text follows it; a CJK full stop needs
    nothing after it). ``text[:n]`` can be spoken now; ``text[n:]`` waits for more. Abbreviations, numbers and URLs
    are not sentence ends (as in :func:`split_text`)."""
    if not isinstance(text, str):
        raise TextError(f"text must be a string, not {type(text).__name__}")
    if not text.strip():
        return 0
    splitter = _Splitter(text, 1 << 30, lambda s: 0)  # every atom fits: none is cut
    best = 0
    for pos, level in splitter.level.items():
        if level > SENTENCE or pos <= best:
            continue
        if pos < len(text) and (text[pos].isspace() or level == NEWLINE) or text[pos - 1] in _FINAL_MARKS:
            best = pos
    return best
