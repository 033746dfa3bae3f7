"""Spans of text that normalisation and segmentation must leave untouched, byte for byte.

Protected:
* every CosyVoice 2 special token (``COSYVOICE2_SPECIAL_TOKENS``: ``[laughter]``, ``[breath]``, ``<strong>``,
  ``</strong>``, ``<laughter>``, ``</laughter>``, ``<|endofprompt|>`` ...);
* any ``<|...|>`` control token;
* any bracket tag made of letters, ``_`` and ``-`` (``[sigh]``, ``[quick_breath]``, ``[vocalized-noise]``) and any
  angle tag of the same shape (``<strong>``, ``</emphasis>``) — so tags of newer models pass too; such spans never hold
  digits, so protecting an unknown one cannot leave a number unread; a bracket tag right before ``(`` is a Markdown
  link's text (``[docs](url)``), not a tag;
* VoxCPM 2's voice-design description: a parenthesised text holding at least one letter at the very start of the
  text (``(A young woman, gentle voice)Hello``; docs/design.md, "VoxCPM 2 sequence layouts"). ``(1) ...`` is not
  a description.

The text *between* ``<strong>`` and ``</strong>`` is ordinary text (normalised); only the markup is protected.
"""

from __future__ import annotations

import re

from cadenza.text.qwen_tokenizer import COSYVOICE2_SPECIAL_TOKENS, ENDOFTEXT

_KNOWN = sorted((*COSYVOICE2_SPECIAL_TOKENS, ENDOFTEXT), key=len, reverse=True)
TAG_RE = re.compile(
    "|".join(re.escape(t) for t in _KNOWN)
    + r"|<\|[^|\n]*\|>"  # any <|...|> control token
    + r"|\[[A-Za-z][A-Za-z_-]*\](?!\()"  # [laughter]-style event tags (not a Markdown link's "[words](")
    + r"|</?[A-Za-z][A-Za-z_-]*>"  # <strong>-style markup
)
# Leading whitespace is not part of the span (it is stripped like any other); the description must hold a letter.
DESCRIPTION_RE = re.compile(r"\A\s*(\((?=[^()\n]*[^\W\d_])[^()\n]*\))")


def protected_spans(text: str, keep_description: bool = True) -> list[tuple[int, int]]:
    """Sorted, non-overlapping ``(start, end)`` spans of ``text`` that must not be changed or split."""
    spans: list[tuple[int, int]] = []
    pos = 0
    if keep_description:
        m = DESCRIPTION_RE.match(text)
        if m:
            spans.append(m.span(1))
            pos = m.end(1)
    spans.extend(m.span() for m in TAG_RE.finditer(text, pos))
    return spans


def split_protected(text: str, keep_description: bool = True) -> list[tuple[bool, str]]:
    """``text`` cut into ``(is_protected, piece)`` pieces whose concatenation is ``text``."""
    pieces: list[tuple[bool, str]] = []
    pos = 0
    for start, end in protected_spans(text, keep_description):
        if start > pos:
            pieces.append((False, text[pos:start]))
        pieces.append((True, text[start:end]))
        pos = end
    if pos < len(text):
        pieces.append((False, text[pos:]))
    return pieces
