"""Text clean-up applied to every request before tokenization (docs/design.md, "VoxCPM 2 text clean-up").

Empty or whitespace-only text is rejected; newlines become spaces and every whitespace run collapses to one space
(a single leading/trailing space is kept, as in the reference). The optional ``normalize=True`` text normaliser of
the reference (wetext + inflect) is not part of this module.
"""

from __future__ import annotations

import re

from cadenza.errors import TextError

_WHITESPACE = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """``"Hi\\nthere   you."`` -> ``"Hi there you."``; raises ``TextError`` for non-strings and blank text."""
    if not isinstance(text, str) or not text.strip():
        raise TextError("the text to speak must be a non-empty string")
    return _WHITESPACE.sub(" ", text.replace("\n", " "))
