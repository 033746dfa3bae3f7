"""An SSML subset -> a list of typed pieces: ``Spoken`` text (with its speaking rate and language) and ``Pause``s.

::

    pieces = parse_ssml('<speak>Hello <break time="300ms"/> <say-as interpret-as="cardinal">42</say-as></speak>',
                        FrontendTraits())
    # [Spoken('Hello ', rate=1.0, lang=None), Pause(300.0), Spoken(' forty-two', rate=1.0, lang=None)]

Supported (docs/text.md, "SSML"): ``<speak>``, ``<p>``, ``<s>``, ``<break time|strength>``, ``<say-as
interpret-as="characters|cardinal|ordinal|date|telephone|currency">``, ``<sub alias>``, ``<prosody rate>``,
``<emphasis level>``, ``<phoneme alphabet="ipa" ph>``, ``<lang xml:lang>``, ``<mark>`` (ignored). What a tag turns
into depends on the model (``FrontendTraits``): emphasis becomes the model's own emphasis tags (CosyVoice 2
``<strong>…</strong>``) or nothing, ``<phoneme>`` an inline phoneme span for models that read phonemes, ``<prosody
rate>`` the model's speed. Anything else -- another tag or attribute, malformed XML, a DOCTYPE (no entity tricks),
a value the model cannot honour -- is an ``InputError`` naming the tag and its line and column.

``Spoken`` text is not normalised yet (the caller normalises each run with its language); say-as expansions are
already words, which normalisation leaves as they are. A lexicon (``cadenza.text.lexicon``) is applied to ordinary
text nodes only, not to what ``<say-as>``, ``<sub>`` or ``<phoneme>`` enclose.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from xml.parsers import expat

from cadenza.errors import InputError
from cadenza.text.lexicon import Lexicon, check_phonemes, phoneme_span
from cadenza.text.say_as import SAY_AS_EXPANSIONS

MAX_BREAK_MS = 10_000.0
MAX_TOTAL_BREAK_MS = 600_000.0  # all breaks of one input together: silence is samples in memory too
# <break strength>: pauses in ms (SSML leaves them to the processor; these follow common practice).
BREAK_STRENGTHS = {"none": 0.0, "x-weak": 100.0, "weak": 250.0, "medium": 500.0, "strong": 750.0,
                   "x-strong": 1000.0}
RATE_WORDS = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.25, "x-fast": 1.5}
SAY_AS = ("characters", "cardinal", "ordinal", "date", "telephone", "currency")
DATE_FORMATS = ("mdy", "dmy", "ymd", "md", "dm", "ym", "my", "y")
_ATTRIBUTES = {
    "speak": {"version", "xml:lang", "xmlns"},
    "p": {"xml:lang"}, "s": {"xml:lang"},
    "break": {"time", "strength"},
    "say-as": {"interpret-as", "format", "detail"},
    "sub": {"alias"},
    "prosody": {"rate"},
    "emphasis": {"level"},
    "phoneme": {"alphabet", "ph"},
    "lang": {"xml:lang"},
    "mark": {"name"},
}
_TIME = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s)\s*\Z")
_RATE = re.compile(r"\s*([+-]?)(\d+(?:\.\d+)?|\.\d+)\s*(%?)\s*\Z")


@dataclass(frozen=True)
class FrontendTraits:
    """What a model's text frontend can do with markup.

    ``emphasis``: the model's own (open, close) emphasis tags, or None (emphasis is then spoken plainly).
    ``phonemes``: the phoneme symbols the model reads, or None (the model reads text: ``<phoneme>`` is refused).
    ``languages``: the languages ``<lang>`` may name (the normaliser's readings, and a phoneme model's own).
    ``rate``: the speaking rates the model makes itself, or None (``<prosody rate>`` other than 1 is refused).
    """

    emphasis: tuple[str, str] | None = None
    phonemes: frozenset[str] | None = None
    languages: tuple[str, ...] = ("en", "zh")
    rate: tuple[float, float] | None = None


@dataclass(frozen=True)
class Spoken:
    """Text to speak (not yet normalised) at ``rate`` x the normal speed, read as ``lang`` (None: by script)."""

    text: str
    rate: float = 1.0
    lang: str | None = None


@dataclass(frozen=True)
class Pause:
    """Silence of exactly ``ms`` milliseconds (``round(ms * sample_rate / 1000)`` zero samples)."""

    ms: float

    def samples(self, sample_rate: int) -> int:
        return round(self.ms * sample_rate / 1000)


Piece = Spoken | Pause


_LEAD = re.compile(r"[\s\ufeff]*")  # spaces, and byte-order marks (what Windows editors write first)
_LINE_BREAK = re.compile(r"\r\n?|\n")


def ssml_start(text: str) -> bool | None:
    """Whether text that may go on (the pieces of it so far) starts as SSML: True, False, or None while it is too
    short to tell (spaces, a byte-order mark, an unfinished ``<?xml ...?>``, or a start of ``<speak`` so far)."""
    head = text[_LEAD.match(text).end():]
    if head.startswith("<?xml"):
        end = head.find("?>")
        if end < 0:
            return None
        head = head[end + 2:].lstrip()
    elif "<?xml".startswith(head):
        return None
    if len(head) <= len("<speak"):
        return None if "<speak".startswith(head) else False
    return head.startswith("<speak") and not (head[6].isalnum() or head[6] in "-_:.")


def looks_like_ssml(text: object) -> bool:
    """Auto-detection: the text starts (after spaces, byte-order marks and an optional ``<?xml ...?>``) with
    ``<speak``. The one rule everywhere: API, CLI, server, and the first pieces of streamed text (``ssml_start``)."""
    if not isinstance(text, str):
        return False
    return ssml_start(text + " ") is True  # the whole text: nothing more comes after it


def check_ssml_start(text: str, plain_hint: str = "send plain text with input_format 'text'") -> int:
    """Where the document starts, past spaces and byte-order marks (``parse_ssml`` hands expat the rest: an
    ``<?xml ...?>`` must be its very start); ``InputError`` at the first character when that is not markup (plain
    text given as SSML: say so, with ``plain_hint``, not expat's "invalid token")."""
    start = _LEAD.match(text).end()
    if start < len(text) and text[start] != "<":
        line, column = _position(text[:start])
        raise InputError(f"SSML at line {line}, column {column}: text before the root element (SSML starts with "
                         f"<speak>; {plain_hint})")
    return start


def _position(lead: str) -> tuple[int, int]:
    """(line, column), 1-based, of the character after ``lead``; byte-order marks take no column (editors hide
    them)."""
    breaks = list(_LINE_BREAK.finditer(lead))
    last = lead[breaks[-1].end():] if breaks else lead
    return len(breaks) + 1, len(last.replace("\ufeff", "")) + 1


def _language(value: str) -> str | None:
    tag = value.strip().lower().replace("_", "-")
    primary = tag.split("-")[0]
    if primary in ("en", "eng"):
        return "en"
    if primary in ("zh", "cmn", "zho", "chi"):
        return "zh"
    return None


@dataclass
class _Frame:
    tag: str
    rate: float
    lang: str | None
    emphasis: bool = False  # this element opened the model's emphasis tag
    line: int = 0
    column: int = 0


class _Parser:
    """One document through expat: a stack of element frames (rate, language, emphasis), the current run's text,
    and the pieces made so far."""

    def __init__(self, traits: FrontendTraits, lexicon: Lexicon | None, origin: tuple[int, int] = (1, 1)) -> None:
        self.traits, self.lexicon = traits, lexicon
        self.origin = origin  # where in the caller's text the document starts (past spaces and byte-order marks)
        self.pieces: list[Piece] = []
        self.stack: list[_Frame] = []
        self.buffer: list[str] = []  # text of the current run (same rate and language)
        self.pending: list[str] = []  # character data since the last tag (expat may deliver it in parts)
        self.run: tuple[float, str | None] = (1.0, None)
        self.literal: _Frame | None = None  # inside <say-as>, <sub> or <phoneme>: content is not ordinary text
        self.literal_text: list[str] = []
        self.literal_attrs: dict[str, str] = {}
        self.emphasis_open = 0  # emphasis elements open (one span of the model's tags however deep)
        self.break_ms = 0.0
        self.seen_root = False
        self.parser = expat.ParserCreate()
        self.parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        self.parser.StartDoctypeDeclHandler = self._doctype
        self.parser.EntityDeclHandler = self._doctype
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end
        self.parser.CharacterDataHandler = self._chars
        self.parser.ProcessingInstructionHandler = self._instruction
        self.parser.buffer_text = True

    # -- errors --------------------------------------------------------------------------------------------------
    def _at(self, line: int, column: int) -> tuple[int, int]:
        """Expat's (line, 1-based column) in the document -> the position in the caller's text."""
        if line == 1:
            return self.origin[0], self.origin[1] + column - 1
        return self.origin[0] + line - 1, column

    def _where(self) -> str:
        line, column = self._at(self.parser.CurrentLineNumber, self.parser.CurrentColumnNumber + 1)
        return f"line {line}, column {column}"

    def error(self, tag: str, message: str, frame: _Frame | None = None) -> InputError:
        where = f"line {frame.line}, column {frame.column}" if frame is not None else self._where()
        return InputError(f"SSML <{tag}> at {where}: {message}")

    def _doctype(self, *args) -> None:
        raise InputError(f"SSML at {self._where()}: DOCTYPE and entity declarations are not allowed")

    def _instruction(self, target, data) -> None:
        raise InputError(f"SSML at {self._where()}: processing instruction <?{target[:40]}?> is not supported")

    # -- output --------------------------------------------------------------------------------------------------
    def _take_text(self) -> None:
        """Move the character data read since the last tag into the run (lexicon applied)."""
        if not self.pending:
            return
        text = "".join(self.pending)
        self.pending.clear()
        if self.lexicon:
            text = self.lexicon.apply(text, self.traits.phonemes)
        self.buffer.append(text)

    def _flush(self) -> None:
        """End the current run (before a pause or a change of rate or language); emphasis spans are closed here
        and reopened in the next run, so every run's text has balanced tags."""
        self._take_text()
        if self.emphasis_open:
            self.buffer.append(self.traits.emphasis[1])
        text = _join_words(self.buffer)
        bare = text.replace(self.traits.emphasis[0], "").replace(self.traits.emphasis[1], "") \
            if self.traits.emphasis else text
        if bare.strip():  # a run of nothing but emphasis tags says nothing
            self.pieces.append(Spoken(text, *self.run))
        self.buffer = [self.traits.emphasis[0]] if self.emphasis_open else []

    def _set_run(self, rate: float, lang: str | None) -> None:
        if (rate, lang) != self.run:
            self._flush()
            self.run = (rate, lang)

    # -- handlers ------------------------------------------------------------------------------------------------
    def _start(self, tag: str, attrs: dict[str, str]) -> None:
        line, column = self._at(self.parser.CurrentLineNumber, self.parser.CurrentColumnNumber + 1)
        if self.literal is not None:
            raise self.error(tag, f"no markup is allowed inside <{self.literal.tag}> (it started at line "
                             f"{self.literal.line}, column {self.literal.column})")
        if not self.seen_root:
            if tag != "speak":
                raise self.error(tag, "the root element must be <speak>")
            self.seen_root = True
        elif tag == "speak":
            raise self.error(tag, "<speak> may only be the root element")
        if tag not in _ATTRIBUTES:
            raise self.error(tag, f"unsupported tag (supported: {', '.join(sorted(_ATTRIBUTES))})")
        for name in attrs:
            if name not in _ATTRIBUTES[tag] and not (tag == "speak" and name.startswith("xmlns")):
                allowed = ", ".join(sorted(_ATTRIBUTES[tag])) or "none"
                raise InputError(f"SSML <{tag} {name}> at line {line}, column {column}: unsupported attribute "
                                 f"(supported: {allowed})")
        self._take_text()
        parent = self.stack[-1] if self.stack else _Frame("", 1.0, None)
        frame = _Frame(tag, parent.rate, parent.lang, line=line, column=column)
        if "xml:lang" in attrs:
            frame.lang = self._lang(tag, attrs["xml:lang"], frame)
        elif tag == "lang":
            raise self.error(tag, "needs the xml:lang attribute", frame)
        if tag == "prosody":
            frame.rate = self._rate(attrs.get("rate", "medium"), parent.rate, frame)
        self.stack.append(frame)
        self._set_run(frame.rate, frame.lang)
        if tag == "break":
            self._break(attrs, frame)
        elif tag in ("p", "s"):
            self.buffer.append("\n")  # a sentence boundary: segmentation cuts here
        elif tag == "emphasis":
            level = attrs.get("level", "moderate")
            if level not in ("strong", "moderate", "none", "reduced"):
                raise self.error(tag, f"level must be strong, moderate, none or reduced, not {level[:40]!r}", frame)
            if self.traits.emphasis is not None and level in ("strong", "moderate"):
                frame.emphasis = True
                self.emphasis_open += 1
                if self.emphasis_open == 1:  # nested emphasis: one span (the model's tags do not nest)
                    self.buffer.append(self.traits.emphasis[0])
        elif tag in ("say-as", "sub", "phoneme"):
            self._check_literal(tag, attrs, frame)
            self.literal, self.literal_text, self.literal_attrs = frame, [], dict(attrs)

    def _end(self, tag: str) -> None:
        frame = self.stack.pop()
        if frame is self.literal:
            self.literal = None
            # An expansion goes straight into the run: it is never looked up in the lexicon.
            self.buffer.append(self._expand(frame, self.literal_attrs, "".join(self.literal_text)))
            return
        self._take_text()
        if tag in ("p", "s"):
            self.buffer.append("\n")
        if frame.emphasis:
            self.emphasis_open -= 1
            if self.emphasis_open == 0:
                self.buffer.append(self.traits.emphasis[1])
        if self.stack:
            parent = self.stack[-1]
            self._set_run(parent.rate, parent.lang)
        else:
            self._flush()

    def _chars(self, data: str) -> None:
        if self.literal is not None:
            self.literal_text.append(data)
        elif self.stack:
            self.pending.append(data)

    # -- tags ----------------------------------------------------------------------------------------------------
    def _lang(self, tag: str, value: str, frame: _Frame) -> str:
        lang = _language(value)
        if lang is None or lang not in self.traits.languages:
            raise self.error(tag, f"xml:lang {value[:40]!r}: this model reads {', '.join(self.traits.languages)}",
                             frame)
        return lang

    def _break(self, attrs: dict[str, str], frame: _Frame) -> None:
        if "time" in attrs:
            m = _TIME.match(attrs["time"])
            if m is None:
                raise self.error("break", f"time {attrs['time'][:40]!r} is not a duration such as '500ms' or "
                                 "'1.5s'", frame)
            ms = float(m.group(1)) * (1.0 if m.group(2) == "ms" else 1000.0)
            if not math.isfinite(ms) or ms > MAX_BREAK_MS:
                raise self.error("break", f"time {attrs['time'][:40]!r} is longer than the {MAX_BREAK_MS / 1000:g} s "
                                 "a break may last", frame)
        else:
            strength = attrs.get("strength", "medium")
            if strength not in BREAK_STRENGTHS:
                raise self.error("break", f"strength {strength[:40]!r} is not one of "
                                 f"{', '.join(BREAK_STRENGTHS)}", frame)
            ms = BREAK_STRENGTHS[strength]
        self.break_ms += ms
        if self.break_ms > MAX_TOTAL_BREAK_MS:
            raise self.error("break", f"the breaks so far add up to {self.break_ms / 1000:g} s; one input may "
                             f"hold at most {MAX_TOTAL_BREAK_MS / 1000:g} s of them", frame)
        self._flush()
        if ms > 0:
            if self.pieces and isinstance(self.pieces[-1], Pause):  # two breaks in a row: one pause, both lengths
                ms += self.pieces.pop().ms
            self.pieces.append(Pause(ms))

    def _rate(self, value: str, parent: float, frame: _Frame) -> float:
        word = value.strip().lower()
        if word in RATE_WORDS:
            rate = RATE_WORDS[word]
        else:
            m = _RATE.match(value)
            if m is None:
                raise self.error("prosody", f"rate {value[:40]!r} is not x-slow, slow, medium, fast, x-fast, a "
                                 "percentage ('150%', '+20%') or a multiplier ('1.2')", frame)
            sign, number, percent = m.groups()
            amount = float(number) / (100.0 if percent else 1.0)
            rate = 1.0 + amount if sign == "+" else 1.0 - amount if sign == "-" else amount
            if sign and not percent:
                raise self.error("prosody", f"rate {value[:40]!r}: a signed change is a percentage ('+20%')",
                                 frame)
        rate = round(rate * parent, 6)  # relative to the enclosing rate, as SSML says
        if rate != 1.0:
            if self.traits.rate is None:
                raise self.error("prosody", f"rate {value[:40]!r}: this model has no speaking-rate control", frame)
            low, high = self.traits.rate
            if not low <= rate <= high:
                raise self.error("prosody", f"rate {value[:40]!r} makes {rate:g} x the normal speed; this model "
                                 f"speaks at {low:g} to {high:g} x", frame)
        return rate

    def _check_literal(self, tag: str, attrs: dict[str, str], frame: _Frame) -> None:
        if tag == "say-as":
            kind = attrs.get("interpret-as")
            if kind not in SAY_AS:
                raise self.error(tag, f"interpret-as {str(kind)[:40]!r} is not supported (supported: "
                                 f"{', '.join(SAY_AS)})", frame)
            fmt = attrs.get("format")
            if kind == "date" and fmt is not None and fmt not in DATE_FORMATS:
                raise self.error(tag, f"date format {fmt[:40]!r} is not one of {', '.join(DATE_FORMATS)}", frame)
        elif tag == "sub":
            if not attrs.get("alias", "").strip():
                raise self.error(tag, "needs a non-empty alias attribute", frame)
        elif tag == "phoneme":
            if self.traits.phonemes is None:
                raise self.error(tag, "this model reads text, not phonemes (only models whose frontend reads "
                                 "espeak-ng phonemes, such as cadenza-tiny, take <phoneme>)", frame)
            alphabet = attrs.get("alphabet", "ipa")
            if alphabet != "ipa":
                raise self.error(tag, f"alphabet {alphabet[:40]!r} is not supported (only 'ipa')", frame)
            if not attrs.get("ph", "").strip():
                raise self.error(tag, "needs a non-empty ph attribute (IPA)", frame)

    def _expand(self, frame: _Frame, attrs: dict[str, str], content: str) -> str:
        """The words a literal element stands for (padded with spaces: they are words of their own)."""
        if frame.tag == "sub":
            return f"{_WORD}{' '.join(attrs['alias'].split())}{_WORD}"
        if frame.tag == "phoneme":
            ipa = check_phonemes(attrs["ph"], self.traits.phonemes, f"SSML <phoneme> at line {frame.line}, "
                                 f"column {frame.column}")
            return f"{_WORD}{phoneme_span(ipa)}{_WORD}"
        kind = attrs["interpret-as"]
        lang = frame.lang or ("zh" if re.search(r"[\u4e00-\u9fff]", content) else "en")
        try:
            words = SAY_AS_EXPANSIONS[kind](content.strip(), lang, attrs.get("format"))
        except (ValueError, IndexError) as exc:
            raise self.error("say-as", f"interpret-as={kind!r}: {exc}", frame) from None
        return words if lang == "zh" else f"{_WORD}{words}{_WORD}"  # Chinese has no spaces between words

    def parse(self, text: str) -> list[Piece]:
        try:
            self.parser.Parse(text, True)
        except expat.ExpatError as exc:
            where = "line {}, column {}".format(*self._at(exc.lineno, exc.offset + 1))
            if exc.code in _ENDS_EARLY:  # a document cut short (e.g. one piece of it streamed): say which
                open_tag = self.stack[-1] if self.stack else None
                inside = ("inside a tag" if exc.code != expat.errors.codes[expat.errors.XML_ERROR_NO_ELEMENTS]
                          or open_tag is None else f"before </{open_tag.tag}> (the <{open_tag.tag}> at line "
                          f"{open_tag.line}, column {open_tag.column})")
                raise InputError(f"incomplete SSML at {where}: the text ends {inside}; SSML is read as one "
                                 "whole <speak> document") from None
            raise InputError(f"malformed SSML at {where}: {expat.errors.messages[exc.code]}") from None
        return self.pieces


# Expat's errors for a document that stops before its end: no element closed yet, or a tag or character cut off.
_ENDS_EARLY = frozenset(expat.errors.codes[m] for m in (expat.errors.XML_ERROR_NO_ELEMENTS,
                                                        expat.errors.XML_ERROR_UNCLOSED_TOKEN,
                                                        expat.errors.XML_ERROR_PARTIAL_CHAR))
_WORD = "\x1f"  # marks the edges of an expansion: a word of its own (see _join_words)
_WORD_EDGE = re.compile(r"\s*\x1f+\s*")
_NO_SPACE_BEFORE = set(",.;:!?)]}\n")
_NO_SPACE_AFTER = set("([{\n")


def _join_words(parts: list[str]) -> str:
    """The run's text: an expansion's edge becomes one space between two words, none next to punctuation, the
    run's ends or a line break (``"Call" + "five" + "."`` -> ``"Call five."``)."""
    text = "".join(parts)

    def edge(m: re.Match) -> str:
        left = text[m.start() - 1] if m.start() > 0 else "\n"
        right = text[m.end()] if m.end() < len(text) else "\n"
        return "" if left in _NO_SPACE_AFTER or right in _NO_SPACE_BEFORE else " "

    return _WORD_EDGE.sub(edge, text)


def parse_ssml(text: str, traits: FrontendTraits, lexicon: Lexicon | None = None) -> list[Piece]:
    """SSML -> ``Spoken`` / ``Pause`` pieces in order (see the module docstring); ``InputError`` naming the tag and
    its position for anything outside the subset or that the model (``traits``) cannot honour."""
    if not isinstance(text, str):
        raise InputError(f"SSML must be a string, not {type(text).__name__}")
    start = check_ssml_start(text)
    pieces = _Parser(traits, lexicon, _position(text[:start])).parse(text[start:])
    if not any(isinstance(p, Spoken) for p in pieces):
        raise InputError("SSML has nothing to speak (only breaks or empty elements)")
    return pieces


# -- say-as ------------------------------------------------------------------------------------------------------
