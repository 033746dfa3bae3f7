"""Chinese number readings: cardinals with 万/亿 grouping and the 零 rules, digit strings, decimals and fractions.

零 rules (the textbook ones): zeros at the end of a 4-digit group are silent; one or more zeros at the start or in
the middle of a group read as a single 零; an all-zero group between non-zero groups reads 零 once
(10050 -> 一万零五十, 100000001 -> 一亿零一, 10001000 -> 一千万一千). 10-19 at the head of a number read 十X, elsewhere 一十X
(15 -> 十五, 115 -> 一百一十五). 两 vs 二: a leading 2 before 千/万/亿 reads 两 for quantities (2000 -> 两千,
20000 -> 两万, 22000 -> 两万二千); 二 everywhere else, and always in ordinals (第二千) and digit readings.
A bare 2 before a measure word (两个) is decided by the caller with :func:`liang_before`.
"""

from __future__ import annotations

DIGITS = "零一二三四五六七八九"
_SECTION_UNITS = ("千", "百", "十", "")
_GROUP_UNITS = ("", "万", "亿", "万亿")
MAX_CARDINAL_DIGITS = 16  # up to 万亿 groups; longer strings are read digit by digit

# Words after which a bare 2 reads 两 (两个, 两年, 两点, 两公里 ...); checked against the text that follows the number.
_LIANG_CHARS = frozenset(
    "个位只本张条件次天年岁点倍块元斤米人种双对家辆台部间头匹杯瓶碗份篇首句层周秒分场轮局百千万亿名支根棵片颗架艘座所门项"
    "套节类样段遍趟顿口桶盒箱袋包碗顶把辆盘届"
)
_LIANG_WORDS = ("公里", "公斤", "公分", "公顷", "小时", "星期", "英里", "英尺", "千米", "千克", "毫升", "美元", "欧元", "英镑", "日元")
_NOT_LIANG = ("年级", "分之")  # 二年级, 二分之一


def digits(s: str, yao: bool = False) -> str:
    """``"2024"`` -> ``"二零二四"``; with ``yao`` 1 reads 幺 (phone numbers)."""
    table = DIGITS.replace("一", "幺") if yao else DIGITS
    return "".join(table[ord(c) - 48] for c in s if "0" <= c <= "9")


def _section(v: int, head: bool) -> str:
    """Reading of 1 <= v <= 9999 inside a number; ``head`` = this section starts the whole number."""
    out: list[str] = []
    started = zero = False
    for d, unit in zip((v // 1000, v // 100 % 10, v // 10 % 10, v % 10), _SECTION_UNITS):
        if d == 0:
            zero = zero or started
            continue
        if zero:
            out.append("零")
            zero = False
        out.append("十" if unit == "十" and d == 1 and head and not started else DIGITS[d] + unit)
        started = True
    return "".join(out)


def cardinal(n: int | str, ordinal: bool = False) -> str:
    """``10050`` -> ``"一万零五十"``; negatives get 负; ``ordinal`` keeps 二 where a quantity would say 两."""
    if isinstance(n, str):
        s = n.replace(",", "").lstrip("0") or "0"
        if len(s) > MAX_CARDINAL_DIGITS:
            return digits(s)
        n = int(s)
    if n < 0:
        return "负" + cardinal(-n, ordinal)
    if n == 0:
        return "零"
    s = str(n)
    if len(s) > MAX_CARDINAL_DIGITS:
        return digits(s)
    s = s.zfill((len(s) + 3) // 4 * 4)
    groups = [int(s[i : i + 4]) for i in range(0, len(s), 4)]
    out: list[str] = []
    pending_zero = False
    for i, g in enumerate(groups):
        unit = _GROUP_UNITS[len(groups) - 1 - i]
        if g == 0:
            pending_zero = pending_zero or bool(out)
            continue
        if out and (pending_zero or g < 1000):
            out.append("零")
        text = _section(g, head=not out)
        if not out and not ordinal:
            if g == 2 and unit:
                text = "两"  # 两万, 两亿
            elif text.startswith("二千"):
                text = "两" + text[1:]  # 两千
        out.append(text + unit)
        pending_zero = False
    return "".join(out)


def decimal(int_part: str, frac_part: str) -> str:
    """``("3", "14")`` -> ``"三点一四"``; the integer part never takes 两 (二点五)."""
    return cardinal(int_part or "0", ordinal=True) + "点" + digits(frac_part)


def number(int_part: str, frac_part: str | None = None, ordinal: bool = False) -> str:
    """Cardinal or decimal reading of a written number (commas allowed in ``int_part``)."""
    return decimal(int_part, frac_part) if frac_part else cardinal(int_part, ordinal)


def fraction(num: str, den: str) -> str:
    """``("3", "4")`` -> ``"四分之三"``."""
    return cardinal(den, ordinal=True) + "分之" + cardinal(num, ordinal=True)


def liang_before(following: str) -> bool:
    """True when a bare 2 followed by ``following`` reads 两 (a measure word or 千/万/亿 follows)."""
    following = following.lstrip(" ")
    if not following or following.startswith(_NOT_LIANG):
        return False
    return following[0] in _LIANG_CHARS or following.startswith(_LIANG_WORDS)
