"""Character clean-up before normalisation (applied to unprotected text only; idempotent).

* ``\\r\\n`` / ``\\r`` / U+0085 / U+2028 / U+2029 -> ``\\n``; other control characters (Unicode Cc) are removed,
  tab / vertical tab / form feed become spaces;
* full-width digits, Latin letters and ``％`` become ASCII (``２０２４年`` is read like ``2024年``); full-width
  punctuation (，。：) is kept — it is ordinary Chinese punctuation; the micro sign ``µ`` (U+00B5, what keyboards
  type) becomes the Greek ``μ`` (U+03BC) that the unit table and phonemizers know (``5 µg``);
* Mathematical Alphanumeric Symbols (U+1D400-U+1D7FF: the bold, italic, script, double-struck ... letters and
  digits of social-media text, ``𝐇𝐞𝐥𝐥𝐨``, ``𝟏𝟐𝟑``) and the Letterlike Symbols that fill that block's gaps (``ℎ``,
  ``ℬ``, ``ℝ`` ...) become their NFKC forms, plain letters and digits (an English phoneme model refused them as
  "another script");
* every run of horizontal whitespace (incl. NBSP and the ideographic space) becomes one space, spaces next to a line
  break are dropped and more than one blank line collapses to one.
Emoji and other symbols are kept: the tokenizer accepts them and dropping content is the caller's decision.
"""

from __future__ import annotations

import re
import unicodedata

_NEWLINES = re.compile(r"\r\n?|[\x85\u2028\u2029]")
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f]")
# Letterlike Symbols that stand for the reserved code points of the mathematical block (italic h, script, Fraktur
# and double-struck capitals ...).
_MATH_GAPS = "ℎℬℰℱℋℐℒℳℛℯℊℴℭℌℑℜℨℂℍℕℙℚℝℤ"
_MATH_ALNUM = {
    c: folded
    for c in (*map(chr, range(0x1D400, 0x1D800)), *_MATH_GAPS)
    if (folded := unicodedata.normalize("NFKC", c)) != c and folded.isalnum()
}
_FULLWIDTH = str.maketrans(
    {chr(c): chr(c - 0xFEE0) for c in [*range(0xFF10, 0xFF1A), *range(0xFF21, 0xFF3B), *range(0xFF41, 0xFF5B), 0xFF05]}
    | {"\u00b5": "\u03bc"}
    | _MATH_ALNUM
)
_FULLWIDTH_POINT = re.compile(r"(?<=[0-9])．(?=[0-9])")
_HSPACE = re.compile(r"[^\S\n]+")
_SPACE_AT_BREAK = re.compile(r" ?\n ?")
_BLANK_LINES = re.compile(r"\n{3,}")


def clean(text: str) -> str:
    """Normalise newlines, drop control characters, map full-width alphanumerics, collapse whitespace."""
    text = _NEWLINES.sub("\n", text)
    text = _CONTROLS.sub("", text)
    text = _FULLWIDTH_POINT.sub(".", text.translate(_FULLWIDTH))
    text = _HSPACE.sub(" ", text)
    text = _SPACE_AT_BREAK.sub("\n", text)
    return _BLANK_LINES.sub("\n\n", text)
