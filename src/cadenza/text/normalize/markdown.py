"""Markdown markup removed before reading, its words kept.

Text for a voice agent usually comes from an LLM, and LLMs write Markdown: ``**Important:** read this first.``
was read by espeak-ng (and so by the built-in model) as "asterisk asterisk important ...". What is removed:

* emphasis and strike-through markers around words: ``**x**``, ``__x__``, ``*x*``, ``_x_``, ``~~x~~`` (an ``*`` or
  ``_`` between word characters, as in ``2*3`` or ``snake_case``, is not emphasis and stays), and runs of two or
  more ``*`` left without a partner;
* inline code backticks (the code's text stays) and code-fence lines (```` ``` ```` / ``~~~``, with their language);
* links and images: ``[words](url)`` and ``![alt](url)`` read as ``words`` / ``alt``;
* at the start of a line: heading marks (``## Title``), block quotes (``>``; not ``>`` right before a digit or
  ``=``, a comparison: ``>5 years``), bullets (``-``, ``*``, ``+``, ``•``) and horizontal rules (``---``, ``***``).

Numbered list items (``1. Buy milk``) keep their number. Tables are left as they are.
"""

from __future__ import annotations

import re

# An emphasised span is at most this long: the search for a closing marker stops there, so a line of openers that
# never close costs linear time, not quadratic (20,000 characters of "**a " took 1.3 s unbounded).
_SPAN = 400
# What a line starts with or is, shared with the streamed filter (markdown_stream.py), which reads a line at a time.
FENCE_START = r" ?(?:```|~~~)"
RULE_LINE = r" ?([-*_])(?: ?\1){2,} ?"
# A ">" right before a digit or "=" is a comparison (">5 years", "- >=3 GB"), not a block quote.
LINE_MARK = r" ?(?:#{1,6} +|(?:>(?![0-9=]) ?)+|[-*+•] +)"
_FENCE = re.compile(rf"^{FENCE_START}[^\n]*$", re.M)
_RULE = re.compile(rf"^{RULE_LINE}$", re.M)
_HEADING = re.compile(r"^ ?#{1,6} +([^\n]*?)(?: +#+)? *$", re.M)
_QUOTE = re.compile(r"^ ?(?:>(?![0-9=]) ?)+", re.M)
_BULLET = re.compile(r"^ ?[-*+•] +", re.M)
_IMAGE = re.compile(r"!\[([^\]\n]*)\]\([^()\n]*\)")
_LINK = re.compile(r"\[([^\[\]\n]+)\]\([^()\s]*(?: \"[^\"\n]*\")?\)")
_CODE = re.compile(r"(`+)([^`\n]+?)\1")
_STRONG = re.compile(rf"(?<![\w*])\*\*(?=[^\s*])([^\n]{{0,{_SPAN}}}?[^\s*])\*\*(?![\w*])"
                     rf"|(?<!\w)__(?=[^\s_])([^\n]{{0,{_SPAN}}}?[^\s_])__(?!\w)")
_EMPHASIS = re.compile(rf"(?<![\w*])\*(?=[^\s*])([^*\n]{{0,{_SPAN}}}?[^\s*])\*(?![\w*])"
                       rf"|(?<!\w)_(?=[^\s_])([^_\n]{{0,{_SPAN}}}?[^\s_])_(?!\w)")
_STRIKE = re.compile(rf"~~(?=\S)([^\n]{{0,{_SPAN}}}?\S)~~")
_STRAY_STARS = re.compile(r"\*{2,}")


def _inner(m: re.Match) -> str:
    return next(g for g in m.groups() if g is not None)


def _line_marks(text: str) -> str:
    text = _FENCE.sub("", text)
    text = _RULE.sub("", text)
    text = _HEADING.sub(r"\1", text)
    text = _QUOTE.sub("", text)
    return _BULLET.sub("", text)


def strip_markdown(text: str, line_start: bool = True) -> str:
    """``text`` (newlines ``\\n``, runs of spaces collapsed: ``cleanup.clean``'s output) without Markdown markup.
    ``line_start``: whether ``text`` begins a line (a piece after a protected tag does not: its start is not read as
    a heading or a bullet).

    Applied until nothing changes (``***x***`` is strong and emphasis at once), so applying it again changes nothing.
    """
    for _ in range(8):
        before = text
        if line_start:
            text = _line_marks(text)
        elif "\n" in text:
            first, rest = text.split("\n", 1)
            text = first + "\n" + _line_marks(rest)
        text = _IMAGE.sub(r"\1", text)
        text = _LINK.sub(r"\1", text)
        text = _CODE.sub(r"\2", text)
        text = _STRONG.sub(_inner, text)
        text = _EMPHASIS.sub(_inner, text)
        text = _STRIKE.sub(r"\1", text)
        text = _STRAY_STARS.sub("", text)
        if text == before:
            break
    return text
