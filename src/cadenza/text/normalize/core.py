"""``normalize``: protected tags, clean-up, entity scan, per-entity language, readings, spacing.

Pure and idempotent: the output holds no entity the scan would match again (every digit run, abbreviation, Roman
numeral after a cue, ``&`` ... is replaced by words), clean-up is idempotent and protected spans are found the same
way in the output, so ``normalize(normalize(x)) == normalize(x)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from cadenza.errors import InputError, TextError
from cadenza.text.normalize import abbreviations, en, operators, zh
from cadenza.text.normalize import en_numbers as en_num
from cadenza.text.normalize import zh_numbers as zh_num
from cadenza.text.normalize.cleanup import clean
from cadenza.text.normalize.detect import LANGUAGES, LATIN, ScriptIndex, is_han
from cadenza.text.normalize.markdown import strip_markdown
from cadenza.text.normalize.patterns import ENTITY_RE, KINDS, NUMBER_RE
from cadenza.text.normalize.tags import split_protected

Renderer = Callable[[re.Match], "str | None"]

# kind -> (English reading, Chinese reading); None for Chinese = always English (Latin-script entities).
RENDERERS: dict[str, tuple[Renderer, Renderer | None]] = {
    "date_ymd": (en.date_ymd, zh.date_ymd),
    "date_mdy": (en.date_mdy, zh.date_mdy),
    "date_mname": (en.date_mname, None),
    "date_my": (en.date_my, None),
    "date_dmn": (en.date_dmn, None),
    "time": (en.time, zh.time),
    "time_ap": (en.time_ap, zh.time_ap),
    "phone": (en.phone, zh.phone),
    "vanity": (en.vanity, None),
    "dashed": (en.dashed, zh.dashed),
    "money_sym": (en.money_sym, zh.money_sym),
    "money_code": (en.money_code, zh.money_code),
    "money_suffix": (en.money_suffix, zh.money_suffix),
    "expr": (en.expr, zh.expr),
    "range": (en.range_, zh.range_),
    "version": (en.version, zh.version),
    "percent": (en.percent, zh.percent),
    "decade": (en.decade, zh.decade),
    "height": (en.height, zh.height),
    "measure": (en.measure, zh.measure),
    "ordinal": (en.ordinal, zh.ordinal),
    "dims": (en.dims, zh.dims),
    "times": (en.times, zh.times),
    "fraction": (en.fraction, zh.fraction),
    "vulgar": (en.vulgar, zh.vulgar),
    "ratio": (en.ratio, zh.ratio),
    "tech": (en.tech, None),
    "hash": (en.hash_, zh.hash_),
    "number_no": (en.number_no, None),
    "roman_cue": (abbreviations.render_roman_cue, None),
    "roman_regnal": (abbreviations.render_roman_regnal, None),
    "abbr": (abbreviations.render_abbr, None),
    "amp": (en.amp, zh.amp),
    "math_sym": (en.math_sym, zh.math_sym),
    "compare": (operators.compare_en, operators.compare_zh),
    "power": (operators.power_en, operators.power_zh),
    "number": (en.number, zh.number),
    "point": (en.point, zh.point),
}
assert set(RENDERERS) == set(KINDS), "every entity kind needs a renderer"

_LATIN_OR_DIGIT = re.compile(f"[{LATIN}0-9]")
_DIGIT = re.compile("[0-9]")


def _fallback(text: str, lang: str) -> str:
    """Reading for a match its renderer rejected (``13/13/2024``): every digit run becomes a plain number."""
    read = en_num.number if lang == "en" else zh_num.number
    return NUMBER_RE.sub(lambda m: read(m.group("i"), m.group("f")), text)


def _render_plain(seg: str, offset: int, lang: str | None, index: ScriptIndex | None) -> str:
    """Normalise one unprotected piece; ``offset`` = its position in the masked full text (for ``index``)."""
    out: list[str] = []
    last = ""  # last character emitted, for spacing decisions
    pos = 0
    for m in ENTITY_RE.finditer(seg):
        start, end = m.span()
        en_fn, zh_fn = RENDERERS[m.lastgroup]
        if zh_fn is None:
            use = "en"
        elif lang is not None:
            use = lang
        else:
            use = index.nearest(offset + start, offset + end)
        reading = (en_fn if use == "en" else zh_fn)(m)
        # Not this kind after all and nothing to read ("<" that is no comparison): left as written, spaces too.
        as_written = reading is None and not _DIGIT.search(m.group())
        if reading is None:
            reading = _fallback(m.group(), use)
        gap = seg[pos:start]  # empty if the previous entity swallowed a space (no entity starts with one)
        if use == "zh" and not as_written and gap.endswith(" ") and is_han(gap[-2] if len(gap) > 1 else last):
            gap = gap[:-1]  # 买了 3 本 -> 买了三本
        if gap:
            out.append(gap)
            last = gap[-1]
        if use == "en" and reading[:1].isalnum():
            if _LATIN_OR_DIGIT.match(last):
                reading = " " + reading  # abc123 -> abc one hundred twenty-three
            if end < len(seg) and _LATIN_OR_DIGIT.match(seg[end]) and reading[-1:].isalnum():
                reading += " "  # 42B -> forty-two B
        pos = end
        if use == "zh" and not as_written and seg[end : end + 1] == " " and is_han(seg[end + 1 : end + 2]):
            pos = end + 1
        if reading:
            out.append(reading)
            last = reading[-1]
    out.append(seg[pos:])
    return "".join(out)


def _clean_plain(piece: str, line_start: bool) -> str:
    """``clean`` and ``strip_markdown`` until neither changes anything (one's output can be the other's input: a
    removed code fence leaves blank lines to collapse), so that normalising again changes nothing."""
    for _ in range(8):
        cleaned = clean(strip_markdown(clean(piece), line_start))
        if cleaned == piece:
            break
        piece = cleaned
    return piece


def normalize(text: str, lang: str | None = None, *, keep_description: bool = True) -> str:
    """Spell out numbers, dates, times, money, units, abbreviations ... in English and/or Chinese.

    ``lang``: ``None`` decides per entity by the nearest Han / Latin letter (see :mod:`detect`); ``"en"`` or ``"zh"``
    reads every number in that language (Latin-script entities such as ``Dr.`` or ``Chapter IV`` stay English).
    Tags (``[laughter]``, ``<strong>``, ``<|endofprompt|>`` ...) and, with ``keep_description``, a leading VoxCPM 2
    ``(voice description)`` pass through byte for byte; Markdown markup goes, its words stay (:mod:`markdown`). Never
    raises on any string; ``""`` gives ``""``.
    """
    if not isinstance(text, str):
        raise TextError(f"text must be a string, not {type(text).__name__}")
    if lang is not None and lang not in LANGUAGES:
        raise InputError(f"unsupported normalisation language {lang!r}; use one of {LANGUAGES} or None (auto)")
    pieces, line_start = [], True
    for tag, piece in split_protected(text, keep_description):
        if not tag:
            piece = _clean_plain(piece, line_start)
        pieces.append((tag, piece))
        line_start = piece.endswith("\n") if piece else line_start
    if pieces and not pieces[0][0]:
        pieces[0] = (False, pieces[0][1].lstrip())
    if pieces and not pieces[-1][0]:
        pieces[-1] = (False, pieces[-1][1].rstrip())
    index = None
    if lang is None:
        index = ScriptIndex("".join("\0" * len(piece) if tag else piece for tag, piece in pieces))
    out: list[str] = []
    offset = 0
    for tag, piece in pieces:
        out.append(piece if tag else _render_plain(piece, offset, lang, index))
        offset += len(piece)
    return "".join(out)
