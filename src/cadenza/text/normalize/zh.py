"""Chinese readings of the entities found by :mod:`patterns` (one function per kind; ``None`` = not this kind after
all, the caller falls back to reading the digits as plain numbers)."""

from __future__ import annotations

import re

from cadenza.text.normalize import zh_numbers as num
from cadenza.text.normalize.en import money_parts, month_day, round_range, scaled
from cadenza.text.normalize.units import CURRENCY_CODES, CURRENCY_SYMBOLS, SCALES, UNITS

_OPS = {"+": "加", "-": "减", "−": "减", "×": "乘", "*": "乘", "÷": "除以", "/": "除以", "=": "等于"}
_EXPR_TOKEN = re.compile(r"(?P<n>(?:(?<![0-9])[-−])?[0-9]+(?:\.[0-9]+)?)|(?P<op>[-−+×*÷/=])")
# Numbers after these are dialled or typed, not counted: read digit by digit (拨打110, 学号2021001, 验证码8888).
_DIAL = re.compile(r"(?:拨打|拨|打|电话|热线|号码|致电|呼叫|号|码|账号|帐号|编号|单号|卡号)\s?\Z")
_VULGAR = {"½": (1, 2), "⅓": (1, 3), "⅔": (2, 3), "¼": (1, 4), "¾": (3, 4), "⅕": (1, 5), "⅖": (2, 5), "⅗": (3, 5),
           "⅘": (4, 5), "⅙": (1, 6), "⅚": (5, 6), "⅛": (1, 8), "⅜": (3, 8), "⅝": (5, 8), "⅞": (7, 8)}


def _sign(s: str | None) -> str:
    return {"-": "负", "−": "负", "+": "正"}.get(s or "", "")


def _following(m: re.Match) -> str:
    return m.string[m.end() : m.end() + 6]


def _n(m: re.Match, name: str, ordinal: bool = False) -> str:
    return num.number(m.group(name + "_i"), m.group(name + "_f"), ordinal)


def _count(int_part: str, frac: str | None, following: str) -> str:
    """A quantity: 2 before a measure word reads 两 (两个, 两公里)."""
    if not frac and int_part == "2" and num.liang_before(following):
        return "两"
    return num.number(int_part, frac)


def _date(month: int, day: int, year: str) -> str:
    return num.digits(year) + "年" + num.cardinal(month, True) + "月" + num.cardinal(day, True) + "日"


def date_ymd(m: re.Match) -> str:
    return _date(int(m.group("ymd_m")), int(m.group("ymd_d")), m.group("ymd_y"))


def date_mdy(m: re.Match) -> str | None:
    md = month_day(int(m.group("mdy_a")), int(m.group("mdy_b")), m.group("mdy_sep"))
    return _date(md[0], md[1], m.group("mdy_y")) if md else None


def _clock(h: int, mi: int, sec: str | None, ap: str | None) -> str:
    prefix = "" if not ap else "上午" if ap in "Aa" else "下午"
    text = prefix + ("两" if h == 2 else num.cardinal(h)) + "点"
    if mi or sec:
        text += ("零" + num.DIGITS[mi] if 0 < mi < 10 else num.cardinal(mi)) + "分"
    if sec:
        s = int(sec)
        text += ("零" + num.DIGITS[s] if 0 < s < 10 else num.cardinal(s)) + "秒"
    return text


def time(m: re.Match) -> str:
    return _clock(int(m.group("t_h")), int(m.group("t_m")), m.group("t_s"), m.group("t_ap"))


def time_ap(m: re.Match) -> str:
    return _clock(int(m.group("ta_h")), 0, None, m.group("ta_ap"))


def phone(m: re.Match) -> str:
    bounds = round_range(m.group())
    if bounds:
        return num.cardinal(bounds[0]) + "到" + num.cardinal(bounds[1])
    groups = re.findall(r"\+|[0-9]+", m.group())
    return "，".join("加" if g == "+" else num.digits(g, yao=True) for g in groups).replace("加，", "加")


def dashed(m: re.Match) -> str:
    """``3-2-1`` -> 三二一, ``4-4-2`` -> 四四二; with two-digit numbers a pause between them (``10-9-8`` -> 十、九、八)."""
    parts = m.group("dd").split("-")
    return ("" if all(len(p) == 1 for p in parts) else "、").join(num.cardinal(p) for p in parts)


def _scaled(int_part: str, frac: str | None, power: int) -> str:
    """``("2", "5", 9)`` -> 二十五亿: the amount times the scale, read in 万/亿 units."""
    return num.number(*scaled(int_part, frac, power))


def money(cur_zh: str, sign: str | None, int_part: str, frac: str | None, scale: str | None) -> str:
    """``$1,234.56`` -> 一千二百三十四点五六美元; ``$2.5 billion`` -> 二十五亿美元; ``¥2`` -> 两元."""
    if scale:
        text = _scaled(int_part, frac, SCALES[scale][1])
    else:
        frac = (frac or "").rstrip("0") or None  # ¥12.50 -> 十二点五元
        text = _count(int_part, frac, "个")  # an amount of money is a quantity: 两美元
    return _sign(sign) + text + cur_zh


def money_sym(m: re.Match) -> str:
    cur = CURRENCY_SYMBOLS[m.group("mo_cur")][1].zh
    sign, int_part, frac = money_parts(m)
    if m.group("mo2_i"):
        scale = m.group("mo_sc") or m.group("mo_sc2")  # $2-3 million: both ends are millions (二百万到三百万)
        low = money("", sign, int_part, frac, scale)
        return low + "到" + money(cur, None, m.group("mo2_i"), m.group("mo2_f"), m.group("mo_sc2"))
    return money(cur, sign, int_part, frac, m.group("mo_sc"))


def money_code(m: re.Match) -> str:
    cur = CURRENCY_CODES[m.group("mc_cur")].zh
    return money(cur, m.group("mc_sign"), m.group("mc_i"), m.group("mc_f"), m.group("mc_sc"))


def money_suffix(m: re.Match) -> str:
    code = m.group("ms_cur")
    cur = CURRENCY_CODES[code].zh if code in CURRENCY_CODES else CURRENCY_SYMBOLS[code][1].zh
    return money(cur, m.group("ms_sign"), m.group("ms_i"), m.group("ms_f"), m.group("ms_sc"))


def expr(m: re.Match) -> str:
    words = []
    for t in _EXPR_TOKEN.finditer(m.group()):
        if t.group("n"):
            value = t.group("n")
            sign = _sign(value[0]) if value[0] in "-−" else ""
            int_part, _, frac = value.lstrip("-−").partition(".")
            words.append(sign + num.number(int_part, frac or None, ordinal=True))
        else:
            words.append(_OPS[t.group("op")])
    if len(words) == 3 and words[1] == "减":
        words[1] = "到"  # "10 - 20" is a range
    return "".join(words)


def range_(m: re.Match) -> str:
    a_i, a_f, b_i, b_f = m.group("r_a_i"), m.group("r_a_f"), m.group("r_b_i"), m.group("r_b_f")
    suffix = (m.group("r_suf") or "").strip()
    following = _following(m)
    if not (a_f or b_f or suffix) and len(a_i) == len(b_i) == 4 and following.startswith("年"):
        return num.digits(a_i) + "到" + num.digits(b_i)  # 2020-2024年 -> 二零二零到二零二四年
    unit = UNITS.get(suffix)
    temperature = unit is not None and unit.temperature
    # a bare 2 reads 两 before a measure word or unit (两到三个, 两到三公里), not before temperatures or percents
    follow = following if not suffix else "" if temperature or unit is None else "个"
    neg = "零下" if temperature else "负"
    low = (neg if m.group("r_sign") else "") + _count(a_i, a_f, follow)
    high = (neg if m.group("r_sign2") else "") + _count(b_i, b_f, follow)
    if suffix in ("%", "％"):
        return "百分之" + low + "到百分之" + high
    if suffix == "‰":
        return "千分之" + low + "到千分之" + high
    return low + "到" + high + (unit.zh if unit is not None else "")


def version(m: re.Match) -> str:
    return "点".join(num.cardinal(p, ordinal=True) for p in m.group("v_body").split("."))


def percent(m: re.Match) -> str:
    head = "千分之" if m.group("p_sym") == "‰" else "百分之"
    return _sign(m.group("p_sign")) + head + _n(m, "p")


def decade(m: re.Match) -> str:
    if m.group("dc_y"):
        return num.digits(m.group("dc_y")) + "年代"
    return num.cardinal(m.group("dc_d")) + "年代"


def height(m: re.Match) -> str:
    inches = int(m.group("ht_in"))
    return num.cardinal(m.group("ht_ft")) + "英尺" + (num.cardinal(m.group("ht_in")) + "英寸" if inches else "")


def measure(m: re.Match) -> str:
    unit = UNITS[m.group("u_unit").strip()]
    sign = m.group("u_sign")
    prefix = ("零下" if unit.temperature else "负") if sign in ("-", "−") else _sign(sign)
    if unit.temperature:
        return prefix + _n(m, "u") + unit.zh
    return prefix + _count(m.group("u_i"), m.group("u_f"), "个") + unit.zh


def ordinal(m: re.Match) -> str:
    return "第" + num.cardinal(m.group("o_i"), ordinal=True)


def dims(m: re.Match) -> str:
    parts = [m.group(g) for g in ("x_a", "x_b", "x_c") if m.group(g)]
    return "乘".join(num.number(*p.partition(".")[::2], ordinal=True) for p in parts)


def times(m: re.Match) -> str:
    int_part, _, frac = m.group("mul").partition(".")
    return _count(int_part, frac or None, "倍") + "倍"


def fraction(m: re.Match) -> str:
    text = num.fraction(m.group("f_n"), m.group("f_d"))
    return num.cardinal(m.group("f_w")) + "又" + text if m.group("f_w") else text


def vulgar(m: re.Match) -> str:
    n, d = _VULGAR[m.group("vf")]
    text = num.fraction(str(n), str(d))
    return num.cardinal(m.group("vf_w")) + "又" + text if m.group("vf_w") else text


def ratio(m: re.Match) -> str:
    return num.cardinal(m.group("ra_a"), True) + "比" + num.cardinal(m.group("ra_b"), True)


def hash_(m: re.Match) -> str:
    return num.cardinal(m.group("h_n"), True) + "号"


def amp(m: re.Match) -> str:
    return "和"


_MATH = {"≈": "约等于", "≥": "大于等于", "≤": "小于等于", "≠": "不等于", "±": "正负"}


def math_sym(m: re.Match) -> str:
    return _MATH[m.group("sym_c")]


def number(m: re.Match) -> str:
    int_part, frac, sign = m.group("n_i"), m.group("n_f"), m.group("n_sign")
    following = _following(m)
    if not frac and not sign and len(int_part) == 4 and following.lstrip(" ").startswith("年"):
        return num.digits(int_part)  # 2024年 -> 二零二四年
    if not frac and len(int_part) > 1 and int_part[0] == "0":
        return _sign(sign) + num.digits(int_part)
    if not frac and not sign and len(int_part) >= 3 and _DIAL.search(m.string, max(0, m.start() - 4), m.start()):
        return num.digits(int_part.replace(",", ""), yao=True)  # 拨打110 -> 幺幺零
    if m.string[max(0, m.start() - 1) : m.start()] == "第":
        return num.number(int_part, frac, ordinal=True)  # 第二, 第二千
    return _sign(sign) + (_count(int_part, frac, following) if not sign else num.number(int_part, frac))


def point(m: re.Match) -> str:
    return "零点" + num.digits(m.group("pt_f"))
