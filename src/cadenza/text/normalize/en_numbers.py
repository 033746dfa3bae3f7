"""English number words: cardinals, ordinals, digit strings, decimals, years and fractions (American style, no "and").

Every function takes digit strings or ints and returns lower-case words; numbers too long to read as a quantity
(more than ``MAX_CARDINAL_DIGITS`` digits) are read digit by digit, and int() is never called on such strings
(Python refuses int conversion of very long strings).
"""

from __future__ import annotations

ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
)
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (10**3, "thousand"))
MAX_CARDINAL_DIGITS = 15  # up to 999 trillion; longer strings are identifiers, read digit by digit

_ORDINAL_IRREGULAR = {
    "one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth", "nine": "ninth",
    "twelve": "twelfth",
}


def _below_100(n: int) -> str:
    if n < 20:
        return ONES[n]
    tens, ones = divmod(n, 10)
    return TENS[tens] + ("-" + ONES[ones] if ones else "")


def _below_1000(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    words = [ONES[hundreds] + " hundred"] if hundreds else []
    if rest:
        words.append(_below_100(rest))
    return " ".join(words)


def digits(s: str) -> str:
    """``"0123"`` -> ``"zero one two three"`` (non-digits are skipped)."""
    return " ".join(ONES[ord(c) - 48] for c in s if "0" <= c <= "9")


def cardinal(n: int | str) -> str:
    """``1234`` -> ``"one thousand two hundred thirty-four"``; negatives get ``"minus"``; commas in strings ignored."""
    if isinstance(n, str):
        s = n.replace(",", "").lstrip("0") or "0"
        if len(s) > MAX_CARDINAL_DIGITS:
            return digits(s)
        n = int(s)
    if n < 0:
        return "minus " + cardinal(-n)
    if n == 0:
        return "zero"
    if len(str(n)) > MAX_CARDINAL_DIGITS:
        return digits(str(n))
    words = []
    for value, name in SCALES:
        if n >= value:
            head, n = divmod(n, value)
            words.append(_below_1000(head) + " " + name)
    if n:
        words.append(_below_1000(n))
    return " ".join(words)


def ordinal_word(words: str) -> str:
    """Turn the last word of a cardinal reading into its ordinal: ``"twenty-one"`` -> ``"twenty-first"``."""
    head, sep, last = words.rpartition(" ")
    prefix, hyphen, tail = last.rpartition("-")
    if tail in _ORDINAL_IRREGULAR:
        tail = _ORDINAL_IRREGULAR[tail]
    elif tail.endswith("y"):
        tail = tail[:-1] + "ieth"
    else:
        tail += "th"
    return head + sep + prefix + hyphen + tail


def ordinal(n: int | str) -> str:
    """``21`` -> ``"twenty-first"``; too-long strings stay a digit reading."""
    if isinstance(n, str) and len(n.replace(",", "").lstrip("0")) > MAX_CARDINAL_DIGITS:
        return cardinal(n)
    return ordinal_word(cardinal(n))


def plural(word: str) -> str:
    """Plural of the last word of a reading: ``"nineteen ninety"`` -> ``"nineteen nineties"``."""
    if word.endswith("y"):
        return word[:-1] + "ies"
    if word.endswith(("x", "s", "ch", "sh")):
        return word + "es"
    return word + "s"


def decimal(int_part: str, frac_part: str) -> str:
    """``("3", "14")`` -> ``"three point one four"``; an empty integer part reads ``"point five"``."""
    head = cardinal(int_part) + " " if int_part else ""
    return head + "point " + digits(frac_part)


def number(int_part: str, frac_part: str | None = None) -> str:
    """Cardinal or decimal reading of a written number (commas allowed in ``int_part``)."""
    return decimal(int_part, frac_part) if frac_part else cardinal(int_part)


def year(n: int) -> str:
    """Year reading for 1000-2099: 1999 -> nineteen ninety-nine, 2000 -> two thousand, 2005 -> two thousand five,
    1905 -> nineteen oh five, 1900 -> nineteen hundred, 2024 -> twenty twenty-four. Others read as cardinals."""
    if not 1000 <= n <= 2099 or n == 1000:
        return cardinal(n)
    if 2000 <= n <= 2009:
        return cardinal(n)
    high, low = divmod(n, 100)
    if low == 0:
        return cardinal(high) + " hundred"
    if low < 10:
        return cardinal(high) + " oh " + ONES[low]
    return cardinal(high) + " " + _below_100(low)


def fraction(num: str, den: str) -> str:
    """``("3", "4")`` -> ``"three quarters"``; ``("1", "2")`` -> ``"one half"``; odd denominators ``"X over Y"``."""
    n_digits, d_digits = num.lstrip("0") or "0", den.lstrip("0") or "0"
    if len(n_digits) > 6 or len(d_digits) > 4 or d_digits == "0":
        return cardinal(num) + " over " + cardinal(den)
    n, d = int(n_digits), int(d_digits)
    if d == 1:
        return cardinal(n) + " over one"
    if d == 2:
        name = "half" if n == 1 else "halves"
    elif d == 4:
        name = "quarter" if n == 1 else "quarters"
    elif d <= 10 or d in (12, 16, 20, 32, 64, 100, 1000):
        name = ordinal(d)
        name = name if n == 1 else plural(name)
    else:
        return cardinal(n) + " over " + cardinal(d)
    return cardinal(n) + " " + name
