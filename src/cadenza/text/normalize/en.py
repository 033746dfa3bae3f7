"""English readings of the entities found by :mod:`patterns` (one function per kind; ``None`` = not this kind after
all, the caller falls back to reading the digits as plain numbers)."""

from __future__ import annotations

import re

from cadenza.text.normalize import en_numbers as num
from cadenza.text.normalize.units import CURRENCY_CODES, CURRENCY_SYMBOLS, SCALES, UNITS, Currency

MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
    "December",
)
_MONTH_INDEX = {m[:3]: i for i, m in enumerate(MONTHS, 1)}
_OPS = {"+": "plus", "-": "minus", "−": "minus", "×": "times", "*": "times", "÷": "divided by", "/": "divided by",
        "=": "equals"}
_EXPR_TOKEN = re.compile(r"(?P<n>(?:(?<![0-9])[-−])?[0-9]+(?:\.[0-9]+)?)|(?P<op>[-−+×*÷/=])")
_YEAR_CUE = re.compile(
    r"\b(?:the|in|since|from|until|till|by|year|circa|before|after|during|between|through|early|mid|late|spring|summer|"
    r"autumn|fall|winter|born|died|founded|built)\s+\Z",
    re.IGNORECASE,
)
_YEAR_AFTER = re.compile(r"\s*(?:[.,;:!?)\]\"”']|\Z|\n)|\s+(?:AD|BC|BCE|CE)\b")
_THE_BEFORE = re.compile(r"\b[Tt]he\s+\Z")
_DATE_CUE = re.compile(r"\b(?:on|by|until|till|before|after|since|from|due|[Dd]ated?)\s+\Z")
_SENTENCE_START = re.compile(r"(?:\A|[.!?]\s+|\n\s*)\Z")
_SENTENCE_FOLLOWS = re.compile(r"\s*\Z|\s*\n|\s+[A-Z]")
# Emergency and service numbers, read digit by digit where they are dialled (after a word of calling, or before
# "call", "operator" ...): 911, 999, 112, 000, 111, 988 and the N11 codes. Elsewhere they are numbers (911 people).
_SERVICE_NUMBERS = frozenset({"911", "999", "112", "000", "111", "988", "211", "311", "411", "511", "611", "711",
                              "811"})
_DIAL_BEFORE = re.compile(
    r"\b(?:call(?:s|ed|ing)?|dial(?:s|ed|led|ing|ling)?|phon(?:e|es|ed|ing)|ring(?:s|ing)?|rang|text(?:s|ed|ing)?)"
    r"\s+(?:[0-9]{3}(?:,\s*|\s+or\s+))*\Z",  # "call 911, 112 or 999"
    re.IGNORECASE,
)
_DIAL_AFTER = re.compile(r"[ -](?:call(?:s|ed|er|ers|ing)?|operators?|dispatch(?:ers?)?|hotline|emergency)\b",
                         re.IGNORECASE)
_VULGAR = {"½": (1, 2), "⅓": (1, 3), "⅔": (2, 3), "¼": (1, 4), "¾": (3, 4), "⅕": (1, 5), "⅖": (2, 5), "⅗": (3, 5),
           "⅘": (4, 5), "⅙": (1, 6), "⅚": (5, 6), "⅛": (1, 8), "⅜": (3, 8), "⅝": (5, 8), "⅞": (7, 8)}


def _sign(s: str | None) -> str:
    return {"-": "minus ", "−": "minus ", "+": "plus "}.get(s or "", "")


def _n(m: re.Match, name: str) -> str:
    return num.number(m.group(name + "_i"), m.group(name + "_f"))


def _is_one(int_part: str, frac: str | None) -> bool:
    return int_part.lstrip("0") == "1" and not frac


def _date(month: int, day: int, year: str | None) -> str:
    text = MONTHS[month - 1] + " " + num.ordinal(day)
    return text + ", " + num.year(int(year)) if year else text


def date_ymd(m: re.Match) -> str:
    return _date(int(m.group("ymd_m")), int(m.group("ymd_d")), m.group("ymd_y"))


def month_day(a: int, b: int, sep: str) -> tuple[int, int] | None:
    """(month, day) of ``a<sep>b``: month first (US) unless the separator is ``.`` or ``a`` cannot be a month."""
    day_first = (sep == "." and b <= 12) or a > 12
    month, day = (b, a) if day_first else (a, b)
    return (month, day) if 1 <= month <= 12 and 1 <= day <= 31 else None


def date_mdy(m: re.Match) -> str | None:
    md = month_day(int(m.group("mdy_a")), int(m.group("mdy_b")), m.group("mdy_sep"))
    return _date(md[0], md[1], m.group("mdy_y")) if md else None


def date_mname(m: re.Match) -> str | None:
    day = int(m.group("mn_day"))
    if not 1 <= day <= 31:
        return None
    return _date(_MONTH_INDEX[m.group("mn_mon")[:3]], day, m.group("mn_year"))


def date_my(m: re.Match) -> str:
    return MONTHS[_MONTH_INDEX[m.group("my_mon")[:3]] - 1] + " " + num.year(int(m.group("my_year")))


def date_dmn(m: re.Match) -> str | None:
    day = int(m.group("dm_day"))
    if not 1 <= day <= 31:
        return None
    the = "" if _THE_BEFORE.search(m.string, max(0, m.start() - 8), m.start()) else "the "  # "the 5th of May"
    text = the + num.ordinal(day) + " of " + MONTHS[_MONTH_INDEX[m.group("dm_mon")[:3]] - 1]
    return text + ", " + num.year(int(m.group("dm_year"))) if m.group("dm_year") else text


def _ampm(m: re.Match, group: str) -> str:
    ap = m.group(group)
    if not ap:
        return ""
    text = " AM" if ap in "Aa" else " PM"
    # "p.m." swallowed the sentence's period: give it back when a sentence ends here.
    if m.group().endswith(".") and _SENTENCE_FOLLOWS.match(m.string, m.end()):
        text += "."
    return text


def time(m: re.Match) -> str:
    h, mi, sec = int(m.group("t_h")), int(m.group("t_m")), m.group("t_s")
    ap = _ampm(m, "t_ap")
    # The 24-hour clock's hour "00" is said "zero zero" (00:00 -> zero zero hundred, 00:30 -> zero zero thirty);
    # with AM/PM the hour 0 is twelve.
    hour = "twelve" if ap and h == 0 else "zero zero" if m.group("t_h") == "00" else num.cardinal(h)
    if mi == 0:
        if ap:
            text = hour
        elif 1 <= h <= 12:
            text = hour + " o'clock"
        else:
            text = hour + " hundred"
    else:
        text = hour + " " + ("oh " + num.ONES[mi] if mi < 10 else num.cardinal(mi))
    if sec:
        s = int(sec)
        text += " and " + num.cardinal(s) + (" second" if s == 1 else " seconds")
    return text + ap


def time_ap(m: re.Match) -> str:
    return num.cardinal(int(m.group("ta_h"))) + _ampm(m, "ta_ap")


_SHORT_PHONE = re.compile(r"([0-9]{3})-([0-9]{4})")


def round_range(text: str) -> tuple[str, str] | None:
    """``300-1000`` is a range of round numbers, not a local phone number like ``555-1234``."""
    m = _SHORT_PHONE.fullmatch(text)
    if m and int(m.group(1)) % 10 == 0 and int(m.group(2)) % 100 == 0 and int(m.group(1)) < int(m.group(2)):
        return m.group(1), m.group(2)
    return None


def phone(m: re.Match) -> str:
    bounds = round_range(m.group())
    if bounds:
        return num.cardinal(bounds[0]) + " to " + num.cardinal(bounds[1])
    groups = re.findall(r"\+|[0-9]+", m.group())
    words = ["plus" if g == "+" else num.digits(g) for g in groups]
    area = groups.index("1") + 1 if groups[:1] == ["1"] or groups[:2] == ["+", "1"] else 0
    if len(groups) - area >= 3 and groups[area] == "800":
        words[area] = "eight hundred"  # 1-800-555-0199: one, eight hundred, ... (as it is said)
    return ", ".join(words).replace("plus, ", "plus ")


def vanity(m: re.Match) -> str:
    """``1-800-FLOWERS`` -> one eight hundred FLOWERS (the words as written, read as words)."""
    area = m.group("vn_area")
    head = ("one " if m.group("vn_one") else "") + ("eight hundred" if area == "800" else num.digits(area))
    return head + " " + m.group("vn_word").replace("-", " ")


def dashed(m: re.Match) -> str:
    """``3-2-1`` -> three two one, ``4-4-2`` -> four four two: a countdown, a formation, not a range."""
    return " ".join(num.cardinal(n) for n in m.group("dd").split("-"))


def scaled(int_part: str, frac: str | None, power: int) -> tuple[str, str | None]:
    """``("2.5", None, 4)`` -> ``("25000", None)``: an amount times ten to ``power``, as digit strings."""
    digits = int_part.replace(",", "") + (frac or "")
    point = len(int_part.replace(",", "")) + power
    digits = digits.ljust(point, "0")
    whole, part = digits[:point].lstrip("0") or "0", digits[point:].rstrip("0")
    return whole, part or None


def _amount(int_part: str, frac: str | None, scale: str | None) -> str:
    """An amount without its currency: ``("2", "5", "million")`` -> two point five million; 万/亿 are multiplied out."""
    if scale in ("万", "亿"):
        return num.number(*scaled(int_part, frac, SCALES[scale][1]))
    return num.number(int_part, frac) + (" " + SCALES[scale][0] if scale else "")


def money(cur: Currency, sign: str | None, int_part: str, frac: str | None, scale: str | None) -> str:
    """``$1,234.56`` -> one thousand two hundred thirty-four dollars and fifty-six cents."""
    prefix = _sign(sign)
    if scale in ("万", "亿"):  # $5万: the value, read as a plain amount
        int_part, frac = scaled(int_part, frac, SCALES[scale][1])
        scale = None
    if scale:
        return prefix + num.number(int_part, frac) + " " + SCALES[scale][0] + " " + cur.en_plural
    if frac and cur.en_sub and len(frac) <= 2:
        cents = int(frac.ljust(2, "0"))
        whole = int_part.replace(",", "").lstrip("0")
        main = num.cardinal(int_part) + " " + (cur.en if _is_one(int_part, None) else cur.en_plural)
        sub = num.cardinal(cents) + " " + (cur.en_sub if cents == 1 else cur.en_sub_plural)
        if not whole:
            return prefix + sub
        return prefix + main + (" and " + sub if cents else "")
    return prefix + num.number(int_part, frac) + " " + (cur.en if _is_one(int_part, frac) else cur.en_plural)


def money_parts(m: re.Match) -> tuple[str | None, str, str | None]:
    """(sign, whole part, fraction) of a ``money_sym`` match: ``-$5`` and ``$-5`` alike, ``$.50`` has no whole."""
    sign = m.group("mo_sign") or m.group("mo_sign2")
    if m.group("mo_cents") is not None:
        return sign, "0", m.group("mo_cents")
    return sign, m.group("mo_i"), m.group("mo_f")


def money_sym(m: re.Match) -> str:
    cur = CURRENCY_SYMBOLS[m.group("mo_cur")][0]
    sign, int_part, frac = money_parts(m)
    if m.group("mo2_i"):  # $10-20: one currency name at the end
        low = _sign(sign) + _amount(int_part, frac, m.group("mo_sc"))
        return low + " to " + money(cur, None, m.group("mo2_i"), m.group("mo2_f"), m.group("mo_sc2"))
    return money(cur, sign, int_part, frac, m.group("mo_sc"))


def money_code(m: re.Match) -> str:
    return money(CURRENCY_CODES[m.group("mc_cur")], m.group("mc_sign"), m.group("mc_i"), m.group("mc_f"),
                 m.group("mc_sc"))


def money_suffix(m: re.Match) -> str:
    code = m.group("ms_cur")
    cur = CURRENCY_CODES[code] if code in CURRENCY_CODES else CURRENCY_SYMBOLS[code][0]
    return money(cur, m.group("ms_sign"), m.group("ms_i"), m.group("ms_f"), m.group("ms_sc"))


def expr(m: re.Match) -> str:
    words = []
    for t in _EXPR_TOKEN.finditer(m.group()):
        if t.group("n"):
            value = t.group("n")
            sign = _sign(value[0]) if value[0] in "-−" else ""
            int_part, _, frac = value.lstrip("-−").partition(".")
            words.append(sign + num.number(int_part, frac or None))
        else:
            words.append(_OPS[t.group("op")])
    if words.count("minus") == 1 and len(words) == 3 and words[1] == "minus":
        words[1] = "to"  # "10 - 20" is a range, not a subtraction
    return " ".join(words)


def _unit_words(unit: str, one: bool) -> str:
    u = UNITS[unit.strip()]
    return u.en if one else u.en_plural


def range_(m: re.Match) -> str:
    a_i, a_f, b_i, b_f = m.group("r_a_i"), m.group("r_a_f"), m.group("r_b_i"), m.group("r_b_f")
    suffix = (m.group("r_suf") or "").strip()
    plain = not (a_f or b_f or suffix or m.group("r_sign") or m.group("r_sign2") or "," in a_i + b_i)
    if plain and len(a_i) == 4 and 1000 <= int(a_i) <= 2099 and (
        len(b_i) == 2 or (len(b_i) == 4 and 1000 <= int(b_i) <= 2099)
    ):
        return num.year(int(a_i)) + " to " + (num.cardinal(b_i) if len(b_i) == 2 else num.year(int(b_i)))
    low = _sign(m.group("r_sign")) + num.number(a_i, a_f)
    high = _sign(m.group("r_sign2")) + num.number(b_i, b_f)
    if suffix in ("%", "％"):
        return low + " to " + high + " percent"
    if suffix == "‰":
        return low + " to " + high + " per mille"
    if suffix:
        return low + " to " + high + " " + _unit_words(suffix, False)
    return low + " to " + high


def version(m: re.Match) -> str:
    parts = m.group("v_body").split(".")
    is_ip = len(parts) == 4 and all(len(p) <= 3 and int(p) <= 255 for p in parts)
    return (" dot " if is_ip else " point ").join(num.cardinal(p) for p in parts)


def percent(m: re.Match) -> str:
    word = " per mille" if m.group("p_sym") == "‰" else " percent"
    return _sign(m.group("p_sign")) + _n(m, "p") + word


def decade(m: re.Match) -> str:
    if m.group("dc_y"):
        return num.plural(num.year(int(m.group("dc_y"))))
    return num.plural(num.cardinal(int(m.group("dc_d"))))


_TECH = {"C#": "C sharp", "F#": "F sharp", ".NET": "dot net"}


def tech(m: re.Match) -> str:
    """Names read otherwise than spelled: ``C#`` -> C sharp (espeak-ng: "C hash"), ``.NET`` -> dot net (its full
    stop would end a clause)."""
    return _TECH[m.group("tk") or m.group("tk2")]


def height(m: re.Match) -> str:
    """``6'2"`` -> six foot two, ``5'0"`` -> five foot (how heights are said)."""
    feet, inches = int(m.group("ht_ft")), int(m.group("ht_in"))
    return num.cardinal(feet) + " foot" + (" " + num.cardinal(inches) if inches else "")


def measure(m: re.Match) -> str:
    one = _is_one(m.group("u_i"), m.group("u_f"))
    return _sign(m.group("u_sign")) + _n(m, "u") + " " + _unit_words(m.group("u_unit"), one)


def ordinal(m: re.Match) -> str:
    return num.ordinal(m.group("o_i"))


def dims(m: re.Match) -> str:
    parts = [m.group(g) for g in ("x_a", "x_b", "x_c") if m.group(g)]
    return " by ".join(num.number(*p.partition(".")[::2]) for p in parts)


def times(m: re.Match) -> str:
    int_part, _, frac = m.group("mul").partition(".")
    return num.number(int_part, frac or None) + " times"


def fraction(m: re.Match) -> str:
    n, d = m.group("f_n"), m.group("f_d")
    if (n, d) == ("24", "7"):
        return "twenty-four seven"
    if n == d == "50":
        return "fifty-fifty"
    if not m.group("f_w") and _DATE_CUE.search(m.string, max(0, m.start() - 8), m.start()):
        md = month_day(int(n), int(d), "/") if len(n) <= 2 and len(d) <= 2 else None
        if md:
            return _date(md[0], md[1], None)  # "due on 12/25" -> December twenty-fifth
    text = num.fraction(n, d)
    return num.cardinal(m.group("f_w")) + " and " + text if m.group("f_w") else text


def vulgar(m: re.Match) -> str:
    n, d = _VULGAR[m.group("vf")]
    text = num.fraction(str(n), str(d))
    if m.group("vf_w"):
        return num.cardinal(m.group("vf_w")) + " and " + ("a half" if (n, d) == (1, 2) else text)
    return text


def ratio(m: re.Match) -> str:
    return num.cardinal(m.group("ra_a")) + " to " + num.cardinal(m.group("ra_b"))


def hash_(m: re.Match) -> str:
    return "number " + num.cardinal(m.group("h_n"))


def number_no(m: re.Match) -> str:
    return "number " + num.cardinal(m.group("no_n"))


def amp(m: re.Match) -> str:
    return "and"


_MATH = {"≈": "approximately", "≥": "greater than or equal to", "≤": "less than or equal to", "≠": "not equal to",
         "±": "plus or minus"}


def math_sym(m: re.Match) -> str:
    return _MATH[m.group("sym_c")]


def _is_year(m: re.Match, int_part: str) -> bool:
    if len(int_part) != 4 or m.group("n_f") or m.group("n_sign") or not 1100 <= int(int_part) <= 2099:
        return False
    text, start = m.string, m.start()
    window = max(0, start - 30)
    return bool(
        _YEAR_CUE.search(text, window, start)
        or _SENTENCE_START.search(text, window, start)
        or _YEAR_AFTER.match(text, m.end())
    )


def _is_dialled(m: re.Match, int_part: str) -> bool:
    """An emergency or service number where it is dialled: ``call 911``, ``dial 999``, ``a 112 call``."""
    if int_part not in _SERVICE_NUMBERS or m.group("n_f") or m.group("n_sign"):
        return False
    before = _DIAL_BEFORE.search(m.string, max(0, m.start() - 24), m.start())
    return bool(before or _DIAL_AFTER.match(m.string, m.end()))


def number(m: re.Match) -> str:
    int_part, frac = m.group("n_i"), m.group("n_f")
    if _is_year(m, int_part):
        return num.year(int(int_part))
    if _is_dialled(m, int_part):
        return num.digits(int_part)  # call 911 -> call nine one one
    if not frac and len(int_part) > 1 and int_part[0] == "0":
        return num.digits(int_part)  # 007, zip codes
    return _sign(m.group("n_sign")) + num.number(int_part, frac)


def point(m: re.Match) -> str:
    return "point " + num.digits(m.group("pt_f"))
