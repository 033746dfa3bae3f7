"""Pronunciation lexicons: ``word -> respelling`` or ``word -> phonemes``, applied to the text before normalisation.

::

    lexicon = Lexicon.from_json({"entries": [
        {"word": "Cadenza", "respelling": "ka den za"},                      # any model
        {"word": "NGINX", "phonemes": "ˈɛndʒɪnˌɛks", "case_sensitive": True},  # models that read phonemes
    ]})
    lexicon.apply("I use nginx and NGINX with Cadenza's engine.", phonemes=PHONEME_SYMBOLS)

Matching rules (docs/text.md, "Pronunciation lexicons"):

* **whole words**: an entry matches only where the text has no letter, digit or ``_`` right before and after it
  (``Cadenza`` does not match inside ``Cadenzas``); an entry that starts or ends with a Han character needs no
  boundary on that side (Chinese has no spaces between words). Entries may span several words (``New York``).
* **case**: entries match case-insensitively unless ``case_sensitive`` is true; at one place in the text a
  case-sensitive entry wins over an insensitive one of the same length, and a longer entry over a shorter one.
* one left-to-right pass: a replacement is never matched again, and protected tags (``[laughter]``, ``<strong>``,
  ``<|...|>``) are never looked into.

A phoneme entry becomes an inline phoneme span ``<|ph:IPA|>`` that the phoneme tokenizer reads symbol for symbol
(``cadenza.text.phonemes``); normalisation and segmentation pass it through untouched. Models that read text
(Qwen2 BPE, VoxCPM 2) cannot take phonemes: applying a phoneme entry for them is an ``InputError`` naming the word.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from cadenza.errors import InputError
from cadenza.text.normalize.detect import HAN
from cadenza.text.normalize.tags import split_protected

MAX_ENTRIES = 1000
MAX_WORD_CHARS = 100
MAX_REPLACEMENT_CHARS = 200
MAX_LEXICON_BYTES = 256 * 1024  # a lexicon file or request body
_ENTRY_KEYS = frozenset({"word", "respelling", "phonemes", "case_sensitive"})
# Markup characters: a word or respelling holding one could open or close a tag the frontend protects.
_MARKUP = set("<>[]{}|\\")
_HAN_CHAR = re.compile(f"[{HAN}]")
_RUN = re.compile(r"[^\W_]+")  # a run of letters and digits: where a word-initial entry is looked up
PHONEME_SPAN = re.compile(r"<\|ph:([^|\n]+)\|>")


def phoneme_span(ipa: str) -> str:
    """The inline form of phonemes in text (``<|ph:həˈloʊ|>``): protected from normalisation and never split."""
    return f"<|ph:{ipa}|>"


def check_phonemes(ipa: str, symbols: Collection[str], what: str) -> str:
    """``ipa`` as NFD (how the phoneme tokenizer counts symbols) when every symbol is in ``symbols``; else an
    ``InputError`` naming ``what`` and the first unknown symbol (a model cannot say a sound it never heard)."""
    ipa = unicodedata.normalize("NFD", " ".join(ipa.split()))
    for i, symbol in enumerate(ipa):
        if symbol not in symbols:
            raise InputError(f"{what}: phoneme symbol {symbol!r} (U+{ord(symbol):04X}, at character {i} of "
                             f"{ipa[:60]!r}) is not one this model reads (its espeak-ng IPA symbols)")
    return ipa


def _check_string(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str):
        raise InputError(f"{what} must be a string, not {type(value).__name__}")
    text = " ".join(value.split())
    if not text:
        raise InputError(f"{what} is empty")
    if len(text) > limit:
        raise InputError(f"{what} is {len(text)} characters; at most {limit}")
    for i, c in enumerate(text):
        if c in _MARKUP or unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            raise InputError(f"{what} holds {c!r} (U+{ord(c):04X}) at character {i}: markup and control "
                             f"characters are not allowed")
    return text


@dataclass(frozen=True)
class LexiconEntry:
    """One entry: exactly one of ``respelling`` (text the model reads instead) or ``phonemes`` (espeak-ng IPA)."""

    word: str
    respelling: str | None = None
    phonemes: str | None = None
    case_sensitive: bool = False

    def __post_init__(self) -> None:
        word = _check_string(self.word, "word", MAX_WORD_CHARS)
        if not any(c.isalnum() for c in word):
            raise InputError(f"word {word!r} has no letter or digit to match")
        object.__setattr__(self, "word", word)
        if (self.respelling is None) == (self.phonemes is None):
            raise InputError(f"entry {word!r} needs exactly one of 'respelling' or 'phonemes'")
        if self.respelling is not None:
            respelling = _check_string(self.respelling, f"respelling of {word!r}", MAX_REPLACEMENT_CHARS)
            if not any(c.isalnum() for c in respelling):
                raise InputError(f"respelling of {word!r} has no letter or digit to speak")
            object.__setattr__(self, "respelling", respelling)
        else:
            phonemes = _check_string(self.phonemes, f"phonemes of {word!r}", MAX_REPLACEMENT_CHARS)
            if any(c.isascii() and (c.isdigit() or c in "\"#$%&*+/=@^_`~") for c in phonemes):
                raise InputError(f"phonemes of {word!r} must be IPA (espeak-ng symbols such as 'həlˈoʊ'), got "
                                 f"{phonemes[:60]!r}")
            object.__setattr__(self, "phonemes", unicodedata.normalize("NFD", phonemes))
        if not isinstance(self.case_sensitive, bool):
            raise InputError(f"case_sensitive of {word!r} must be true or false")

    @property
    def key(self) -> str:
        """What two entries must not share: the word, case-folded unless case-sensitive."""
        return ("=" + self.word) if self.case_sensitive else ("~" + self.word.casefold())

    def to_dict(self) -> dict:
        out: dict = {"word": self.word}
        if self.respelling is not None:
            out["respelling"] = self.respelling
        else:
            out["phonemes"] = self.phonemes
        if self.case_sensitive:
            out["case_sensitive"] = True
        return out


def _pattern(entry: LexiconEntry) -> str:
    word = re.escape(entry.word).replace(r"\ ", r"\s+")  # a space in an entry matches any run of spaces
    left = "" if _HAN_CHAR.match(entry.word[0]) else r"(?<!\w)"
    right = "" if _HAN_CHAR.match(entry.word[-1]) else r"(?!\w)"
    body = word if entry.case_sensitive else f"(?i:{word})"
    return f"{left}{body}{right}"


class Lexicon:
    """A validated, bounded set of entries (no two for the same word under the same case rule)."""

    def __init__(self, entries: Iterable[LexiconEntry] = ()) -> None:
        self.entries: tuple[LexiconEntry, ...] = tuple(entries)
        if len(self.entries) > MAX_ENTRIES:
            raise InputError(f"a lexicon holds at most {MAX_ENTRIES} entries, got {len(self.entries)}")
        seen: dict[str, int] = {}
        for i, entry in enumerate(self.entries):
            if entry.key in seen:
                first = self.entries[seen[entry.key]].word
                raise InputError(f"entries {seen[entry.key]} and {i} are both for {first!r} "
                                 f"({'case-sensitive' if entry.case_sensitive else 'any case'}): keep one")
            seen[entry.key] = i
        # Candidates are looked up, not tried one by one (1,000 entries over a long text): an entry that starts a
        # word is indexed by that word's first run of letters and digits (lower-cased), one that starts with a
        # symbol or holds a Han character (no boundary: it may start inside a run) by its first character. At a
        # place, the longest candidate wins, then a case-sensitive one; its own regex decides whether it matches.
        rank = sorted(range(len(self.entries)),
                      key=lambda i: (-len(self.entries[i].word), not self.entries[i].case_sensitive))
        self._patterns = {i: re.compile(_pattern(self.entries[i])) for i in rank}
        self._by_run: dict[str, list[int]] = {}
        self._by_char: dict[str, list[int]] = {}
        for i in rank:
            word = self.entries[i].word
            run = _RUN.match(word)
            if run is None or _HAN_CHAR.search(word):
                self._by_char.setdefault(word[0].lower(), []).append(i)
            else:
                self._by_run.setdefault(run.group().lower(), []).append(i)
        self._rank = {i: r for r, i in enumerate(rank)}

    def __len__(self) -> int:
        return len(self.entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lexicon) and self.entries == other.entries

    def __hash__(self) -> int:
        return hash(self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    @classmethod
    def from_json(cls, data: object, what: str = "lexicon") -> Lexicon:
        """``{"entries": [...]}`` or a bare list of entry objects; errors name the entry's index and field."""
        if isinstance(data, dict):
            extra = set(data) - {"entries"}
            if extra:
                raise InputError(f"{what}: unknown field(s) {', '.join(sorted(map(str, extra)))[:100]} (use "
                                 "'entries')")
            data = data.get("entries", [])
        if not isinstance(data, list):
            raise InputError(f"{what} must be a list of entries or {{\"entries\": [...]}}, not "
                             f"{type(data).__name__}")
        if len(data) > MAX_ENTRIES:
            raise InputError(f"{what} holds at most {MAX_ENTRIES} entries, got {len(data)}")
        entries = []
        for i, raw in enumerate(data):
            if not isinstance(raw, dict):
                raise InputError(f"{what} entry {i} must be an object with 'word' and 'respelling' or 'phonemes'")
            extra = set(raw) - _ENTRY_KEYS
            if extra:
                raise InputError(f"{what} entry {i}: unknown field(s) {', '.join(sorted(map(str, extra)))[:100]} "
                                 f"(fields: {', '.join(sorted(_ENTRY_KEYS))})")
            try:
                entries.append(LexiconEntry(raw.get("word"), raw.get("respelling"), raw.get("phonemes"),
                                            raw.get("case_sensitive", False)))
            except InputError as exc:
                raise InputError(f"{what} entry {i}: {exc}") from None
        try:
            lexicon = cls(entries)
        except InputError as exc:
            raise InputError(f"{what}: {exc}") from None
        size = len(json.dumps(lexicon.to_json(), ensure_ascii=False).encode("utf-8"))
        if size > MAX_LEXICON_BYTES:  # as a file or a saved voice's is bounded (a request's came here parsed)
            raise InputError(f"{what} is {size} bytes as JSON; at most {MAX_LEXICON_BYTES}")
        return lexicon

    @classmethod
    def from_text(cls, text: str | bytes, what: str = "lexicon") -> Lexicon:
        if len(text) > MAX_LEXICON_BYTES:
            raise InputError(f"{what} is {len(text)} bytes; at most {MAX_LEXICON_BYTES}")
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: "[[[[...": too deep
            raise InputError(f"{what} is not valid JSON: {str(exc)[:200] or type(exc).__name__}") from None
        return cls.from_json(data, what)

    @classmethod
    def from_file(cls, path: str | Path) -> Lexicon:
        path = Path(path)
        try:
            size = path.stat().st_size
            if size > MAX_LEXICON_BYTES:
                raise InputError(f"lexicon file {path} is {size} bytes; at most {MAX_LEXICON_BYTES}")
            data = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read the lexicon file {path}: {exc.strerror or exc}") from None
        return cls.from_text(data, f"lexicon file {path}")

    def to_json(self) -> dict:
        return {"entries": [e.to_dict() for e in self.entries]}

    def over(self, base: Lexicon | None) -> Lexicon:
        """This lexicon's entries plus those of ``base`` for words it has no entry for, in any case (a request's
        lexicon over a voice's: the request decides how its words are said)."""
        if not base:
            return self
        mine = {e.word.casefold() for e in self.entries}
        kept = [e for e in base.entries if e.word.casefold() not in mine]
        return Lexicon([*self.entries, *kept][:MAX_ENTRIES])

    def apply(self, text: str, phonemes: Collection[str] | None = None, description: bool = True) -> str:
        """``text`` with every whole-word match replaced (protected tags untouched). ``phonemes``: the symbols the
        model reads when its frontend takes phonemes (then phoneme entries become ``<|ph:...|>`` spans); ``None``
        for models that read text, where a phoneme entry that matches is an ``InputError`` naming its word.
        ``description``: a leading ``(description)`` is protected (False for a later piece of a streamed text)."""
        if not self.entries or not text:
            return text
        out = []
        for protected, piece in split_protected(text, keep_description=description):
            out.append(piece if protected else self._substitute(piece, phonemes))
        return "".join(out)

    def match_spans(self, text: str, description: bool = True) -> list[tuple[int, int]]:
        """``(start, end)`` of every place ``apply`` would replace, and of every protected tag, in order."""
        spans, pos = [], 0
        for protected, piece in split_protected(text, keep_description=description):
            if protected:
                spans.append((pos, pos + len(piece)))
            else:
                spans += [(pos + a, pos + b) for a, b, _ in self._matches(piece)]
            pos += len(piece)
        return spans

    def _substitute(self, text: str, phonemes: Collection[str] | None) -> str:
        out, done = [], 0
        for start, end, i in self._matches(text):
            out += [text[done:start], self._replace(self.entries[i], phonemes)]
            done = end
        out.append(text[done:])
        return "".join(out)

    def _matches(self, text: str) -> list[tuple[int, int, int]]:
        """(start, end, entry index) of each replacement, in order. One left-to-right pass: at each place where an
        entry could start, the first candidate (longest, then case-sensitive) whose pattern matches is taken; the
        scan goes on after it."""
        places: dict[int, list[int]] = {}
        for m in _RUN.finditer(text):
            found = self._by_run.get(m.group().lower())
            if found:
                places[m.start()] = list(found)
        if self._by_char:
            for pos, c in enumerate(text):
                found = self._by_char.get(c.lower())
                if found:
                    places.setdefault(pos, []).extend(found)
        found, done = [], 0
        for start in sorted(places):
            if start < done:
                continue
            for i in sorted(places[start], key=self._rank.__getitem__):
                m = self._patterns[i].match(text, start)
                if m:
                    found.append((start, m.end(), i))
                    done = m.end()
                    break
        return found

    def _replace(self, entry: LexiconEntry, phonemes: Collection[str] | None) -> str:
        if entry.respelling is not None:
            return entry.respelling
        if phonemes is None:
            raise InputError(f"lexicon entry {entry.word!r} gives phonemes, but this model reads text, not "
                             "phonemes: give a 'respelling' instead")
        ipa = check_phonemes(entry.phonemes, phonemes, f"lexicon entry {entry.word!r}")
        return phoneme_span(ipa)
