"""``<say-as interpret-as="...">`` for the SSML subset (``ssml.py``): the words a literal stands for, by
interpretation (characters, cardinal, ordinal, date, telephone, currency), in English or Chinese. Each expansion
takes ``(content, lang, format)`` and raises ``ValueError`` for content it cannot read that way."""

from __future__ import annotations

import re

from cadenza.text.normalize import en_numbers, zh_numbers
from cadenza.text.normalize import normalize as normalize_text
from cadenza.text.normalize.en import MONTHS

_MONEY = re.compile(r"[$€£¥￥₹₩]|(?<![A-Za-z])[A-Z]{3}(?![A-Za-z])|元|美元|欧元|英镑|日元")
_LETTER_SYMBOLS = {"&": "and", "@": "at", "+": "plus", "#": "hash", "/": "slash", ".": "dot", "_": "underscore",
                   "-": "dash", "*": "star", "%": "percent", "=": "equals", "$": "dollar"}


def _integer(content: str) -> tuple[str, str, str | None]:
    m = re.fullmatch(r"([+-]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?", content.replace(" ", ""))
    if m is None:
        raise ValueError(f"{content[:40]!r} is not a number")
    return m.group(1), m.group(2).replace(",", ""), m.group(3)


def _cardinal(content: str, lang: str, fmt: str | None) -> str:
    sign, whole, frac = _integer(content)
    if lang == "zh":
        return ("负" if sign == "-" else "") + zh_numbers.number(whole, frac)
    return ("minus " if sign == "-" else "") + en_numbers.number(whole, frac)


def _ordinal(content: str, lang: str, fmt: str | None) -> str:
    m = re.fullmatch(r"(\d+)(?:st|nd|rd|th|\.)?", content.replace(",", "").strip().lower())
    if m is None:
        raise ValueError(f"{content[:40]!r} is not an ordinal number such as '3' or '3rd'")
    if lang == "zh":
        return "第" + zh_numbers.cardinal(m.group(1), ordinal=True)
    return en_numbers.ordinal(m.group(1))


def _characters(content: str, lang: str, fmt: str | None) -> str:
    if not content:
        raise ValueError("nothing to spell")
    items = []
    for c in content:
        if c.isspace():
            continue
        if "0" <= c <= "9":
            items.append(zh_numbers.digits(c) if lang == "zh" else en_numbers.ONES[ord(c) - 48])
        elif c.isalpha():
            items.append(c.upper())
        elif c in _LETTER_SYMBOLS and lang != "zh":
            items.append(_LETTER_SYMBOLS[c])
    if not items:
        raise ValueError(f"{content[:40]!r} has no letter, digit or symbol to spell")
    # Chinese: one syllable each; English: hyphens keep letters as letter names ("A-B-C"), not words ("a").
    return " ".join(items) if lang == "zh" else "-".join(items)


def _telephone(content: str, lang: str, fmt: str | None) -> str:
    if not re.fullmatch(r"\+?[\d\s().\-/]+", content) or not re.search(r"\d", content):
        raise ValueError(f"{content[:40]!r} is not a telephone number (digits, spaces, + ( ) - . /)")
    groups = re.findall(r"\d+", content)
    if lang == "zh":
        words = "，".join(zh_numbers.digits(g, yao=True) for g in groups)
        return ("加" if content.startswith("+") else "") + words
    words = ", ".join(en_numbers.digits(g) for g in groups)
    return ("plus " if content.startswith("+") else "") + words


def _date(content: str, lang: str, fmt: str | None) -> str:
    numbers = re.findall(r"\d+", content)
    if fmt is None:  # ISO order when the year comes first, else US order
        four = [len(n) == 4 for n in numbers]
        fmt = {3: "ymd" if four[0] else "mdy", 2: "ym" if four[0] else ("my" if four[1] else "md"),
               1: "y"}.get(len(numbers), "ymd")
    if len(numbers) != len(fmt) or re.search(r"[^\d\s/.\-,]", content):
        raise ValueError(f"{content[:40]!r} does not hold the {len(fmt)} number(s) of format {fmt!r}")
    fields = dict(zip(fmt, (int(n) for n in numbers), strict=True))
    month, day, year = fields.get("m"), fields.get("d"), fields.get("y")
    if month is not None and not 1 <= month <= 12:
        raise ValueError(f"month {month} is not 1-12")
    if day is not None and not 1 <= day <= 31:
        raise ValueError(f"day {day} is not 1-31")
    if lang == "zh":
        text = "".join(f"{v}{unit}" for v, unit in ((year, "年"), (month, "月"), (day, "日")) if v is not None)
        return normalize_text(text, lang="zh")
    if month is None:
        if day is not None:
            raise ValueError("a day needs its month")
        return en_numbers.year(year)
    words = MONTHS[month - 1]
    if day is not None:
        words += " " + en_numbers.ordinal(day)
    if year is not None:
        words += (", " if day is not None else " ") + en_numbers.year(year)
    return words


def _currency(content: str, lang: str, fmt: str | None) -> str:
    words = normalize_text(content, lang=lang)
    if not _MONEY.search(content) or not re.search(r"\d", content) or re.search(r"\d", words) or words == " ".join(content.split()):
        raise ValueError(f"{content[:40]!r} is not an amount of money such as '$12.50', '€3', '100 USD'")
    return words


SAY_AS_EXPANSIONS = {"characters": _characters, "cardinal": _cardinal, "ordinal": _ordinal, "date": _date,
           "telephone": _telephone, "currency": _currency}
