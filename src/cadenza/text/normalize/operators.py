"""Readings of the ASCII comparison signs and of ``^`` (English and Chinese).

``<`` ``>`` ``<=`` ``>=`` are read as comparisons only where their neighbours make them one (espeak-ng says nothing
for them, so "It is >5 degrees" was heard as "It is 5 degrees"):

* before a number, whatever precedes (``>5 degrees``, ``x<10``, ``10 < 20``, ``<$5``, ``<-3``): greater than five
  degrees, x less than ten ...;
* before a single-letter variable, after a number, a single letter or ``)``, with a space on both sides or on
  neither (``x < y``, ``a>=b``, ``(n+1) > k``, ``5 > x``).

Anything else stays as written and unread: a menu path (``Settings > Privacy``), arrows (``->``, ``=>``, ``<=>``,
``<>``), shifts (``<<``, ``>>``), generics (``Map<K, V>``), and the heart ``<3`` (a lone 3 after a space, at the end
of a line with no full stop after it or after a subject pronoun: ``Tom & Jerry <3``, ``I <3 you``). Markup never
gets here: tags such as ``<strong>`` and ``<|...|>`` are protected spans, SSML is parsed before normalisation, and a
line start ``>`` followed by a space is a Markdown block quote.

``^``: ``x^2`` -> x squared, ``2^3`` -> two cubed, ``2^10`` -> two to the power of ten, ``e^x``, ``10^-3``.
"""

from __future__ import annotations

import re

from cadenza.text.normalize import en_numbers as en_num
from cadenza.text.normalize import zh_numbers as zh_num

_EN = {"<": "less than", ">": "greater than", "<=": "less than or equal to", ">=": "greater than or equal to"}
_ZH = {"<": "小于", ">": "大于", "<=": "小于等于", ">=": "大于等于"}

_RIGHT_NUMBER = re.compile(r"[-−+]?(?:[$€£¥]\s?)?\.?[0-9]")
_RIGHT_VARIABLE = re.compile(r"[A-Za-z](?![A-Za-z])")
# What is left of the operator for a variable on its right: a number, a single letter (``5a`` counts: it is read
# "five a"), ``)`` or ``%``.
_LEFT_OPERAND = re.compile(r"(?:[0-9%)]|(?<![A-Za-z])[A-Za-z])\Z")
_HEART = re.compile(r"3+(?![0-9.,%\w])")
_HEART_LINE_END = re.compile(r"[^\w\n.,;:)]*(?:\n|\Z)")  # nothing more to read on the line, no full stop
_HEART_SUBJECT = re.compile(r"(?<![\w'’])(?:I|i|[Ww]e|[Yy]ou|u|[Tt]hey|[Hh]e|[Ss]he|[Ee]veryone) \Z")


def comparison(m: re.Match) -> str | None:
    """The operator of a ``compare`` match when its neighbours make it a comparison, else None."""
    text, start, end = m.string, m.start(), m.end()
    op = m.group("cmp_op")
    spaced_before = text[start - 1 : start] == " "
    spaced_after = text[end : end + 1] == " "
    right = end + 1 if spaced_after else end
    left = start - 1 if spaced_before else start
    if _RIGHT_NUMBER.match(text, right):
        heart = _HEART.match(text, right)
        if op == "<" and heart and not spaced_after and (start == 0 or text[start - 1].isspace()) and (
            _HEART_LINE_END.match(text, heart.end()) or _HEART_SUBJECT.search(text, max(0, start - 12), start)
        ):
            return None
        return op
    if spaced_before != spaced_after or not _RIGHT_VARIABLE.match(text, right):
        return None
    return op if _LEFT_OPERAND.search(text, max(0, left - 2), left) else None


def compare_en(m: re.Match) -> str | None:
    op = comparison(m)
    return _EN[op] if op else None


def compare_zh(m: re.Match) -> str | None:
    op = comparison(m)
    return _ZH[op] if op else None


def _exponent(m: re.Match, number) -> tuple[str, str]:
    """(sign word, the exponent read by ``number``; a letter as it is)."""
    e = m.group("pw_e")
    sign = e[:1] in "-−"
    e = e.lstrip("-−")
    if not e[0].isdigit():
        return sign, e
    int_part, _, frac = e.partition(".")
    return sign, number(int_part, frac or None)


def power_en(m: re.Match) -> str:
    e = m.group("pw_e")
    if e in ("2", "3"):
        return "squared" if e == "2" else "cubed"
    sign, value = _exponent(m, en_num.number)
    return "to the power of " + ("minus " if sign else "") + value


def power_zh(m: re.Match) -> str:
    e = m.group("pw_e")
    if e in ("2", "3"):
        return "的平方" if e == "2" else "的立方"
    sign, value = _exponent(m, zh_num.number)
    return "的" + ("负" if sign else "") + value + "次方"
