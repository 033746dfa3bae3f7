"""Cut a long raw text into blocks that can be planned one at a time (a book read aloud without planning it whole).

Planning a text (normalisation, segmentation, each segment's ids) takes time in proportion to its length: ~7 s for
a million characters with the built-in model, all of it before the first audio. ``text_blocks`` cuts the raw text,
before normalisation, where planning it in pieces changes nothing or next to nothing: at a paragraph break (a
blank line) past half the block size, else at the last sentence end that the text after it confirms
(``complete_prefix``, the rule text streamed sentence by sentence uses), else at the last whitespace, and only as a
last resort inside a word (a block of ``block_chars`` without a single space). For a model that reads one sentence
per segment (the built-in one) the segments are then exactly those of the whole text; for others a segment never
spans two blocks, which the whole text's packing might have done at that paragraph break or sentence end.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from cadenza.errors import InputError, TextError
from cadenza.text.segment import complete_prefix

_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*")
_SPACE = re.compile(r"\s+")


def _cut(window: str) -> int:
    """Where to end a block that starts ``window`` (``0 < cut <= len(window)``)."""
    half = len(window) // 2
    breaks = [m.end() for m in _PARAGRAPH.finditer(window, half)]
    if breaks:
        return breaks[-1]
    end = complete_prefix(window)
    if end > 0:
        return end
    spaces = [m.end() for m in _SPACE.finditer(window, 1)]
    return spaces[-1] if spaces else len(window)


def text_blocks(text: str, block_chars: int) -> Iterator[str]:
    """``text`` in consecutive blocks of at most ``block_chars`` characters (see the module docstring); joined they
    are ``text`` exactly. Lazy: each block is found when asked for."""
    if not isinstance(text, str):
        raise TextError(f"text must be a string, not {type(text).__name__}")
    if isinstance(block_chars, bool) or not isinstance(block_chars, int) or block_chars < 2:
        raise InputError(f"block_chars must be an integer of at least 2, got {block_chars!r}")
    start = 0
    while start < len(text):
        if len(text) - start <= block_chars:
            yield text[start:]
            return
        cut = _cut(text[start:start + block_chars])
        yield text[start:start + cut]
        start += cut
