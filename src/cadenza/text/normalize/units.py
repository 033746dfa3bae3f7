"""Measurement units, currencies and scale words with their English and Chinese readings (data only)."""

from __future__ import annotations

from typing import NamedTuple


class Unit(NamedTuple):
    en: str  # singular ("kilometer"); the reading for exactly 1
    en_plural: str
    zh: str  # 公里; data units keep their letters in Chinese (五GB), which is how they are said
    temperature: bool = False  # zh reads negatives as 零下 and never uses 两


def _u(en: str, zh: str, plural: str | None = None, temperature: bool = False) -> Unit:
    return Unit(en, plural or en + "s", zh, temperature)


# Units that may follow the number after one space ("5 km") or attached ("5km").
SPACED_UNITS: dict[str, Unit] = {
    "km/h": _u("kilometer per hour", "公里每小时", "kilometers per hour"),
    "kph": _u("kilometer per hour", "公里每小时", "kilometers per hour"),
    "mph": _u("mile per hour", "英里每小时", "miles per hour"),
    "m/s": _u("meter per second", "米每秒", "meters per second"),
    "km²": _u("square kilometer", "平方公里"),
    "m²": _u("square meter", "平方米"),
    "cm²": _u("square centimeter", "平方厘米"),
    "m³": _u("cubic meter", "立方米"),
    "cm³": _u("cubic centimeter", "立方厘米"),
    "°C": _u("degree Celsius", "摄氏度", "degrees Celsius", True),
    "℃": _u("degree Celsius", "摄氏度", "degrees Celsius", True),
    "°F": _u("degree Fahrenheit", "华氏度", "degrees Fahrenheit", True),
    "℉": _u("degree Fahrenheit", "华氏度", "degrees Fahrenheit", True),
    "km": _u("kilometer", "公里"),
    "cm": _u("centimeter", "厘米"),
    "mm": _u("millimeter", "毫米"),
    "μm": _u("micrometer", "微米"),  # Greek mu: clean-up maps the micro sign (U+00B5) to it
    "nm": _u("nanometer", "纳米"),
    "m": _u("meter", "米"),
    "kg": _u("kilogram", "千克"),
    "mg": _u("milligram", "毫克"),
    "μg": _u("microgram", "微克"),
    "mcg": _u("microgram", "微克"),
    "g": _u("gram", "克"),
    "ml": _u("milliliter", "毫升"),
    "μL": _u("microliter", "微升"),
    "μl": _u("microliter", "微升"),
    "mL": _u("milliliter", "毫升"),
    "L": _u("liter", "升"),
    "ft": _u("foot", "英尺", "feet"),
    "mi": _u("mile", "英里"),
    "lbs": _u("pound", "磅"),
    "lb": _u("pound", "磅"),
    "oz": _u("ounce", "盎司"),
    "hrs": _u("hour", "小时"),
    "hr": _u("hour", "小时"),
    "mins": _u("minute", "分钟"),
    "min": _u("minute", "分钟"),
    "secs": _u("second", "秒"),
    "sec": _u("second", "秒"),
    "ms": _u("millisecond", "毫秒"),
    "μs": _u("microsecond", "微秒"),
    "GHz": _u("gigahertz", "吉赫", "gigahertz"),
    "MHz": _u("megahertz", "兆赫", "megahertz"),
    "kHz": _u("kilohertz", "千赫", "kilohertz"),
    "Hz": _u("hertz", "赫兹", "hertz"),
    "Gbps": _u("gigabit per second", "Gbps", "gigabits per second"),
    "Mbps": _u("megabit per second", "Mbps", "megabits per second"),
    "KB": _u("kilobyte", "KB"),
    "kB": _u("kilobyte", "KB"),
    "MB": _u("megabyte", "MB"),
    "GB": _u("gigabyte", "GB"),
    "TB": _u("terabyte", "TB"),
    "kWh": _u("kilowatt hour", "千瓦时"),
    "kW": _u("kilowatt", "千瓦"),
    "mAh": _u("milliamp hour", "毫安时"),
    "dB": _u("decibel", "分贝"),
}
# Units too ambiguous after a space ("5 in the", "5 s"): only attached ("5in", "5s", "3h").
ATTACHED_UNITS: dict[str, Unit] = {
    "in": _u("inch", "英寸", "inches"),
    "h": _u("hour", "小时"),
    "s": _u("second", "秒"),
    "l": _u("liter", "升"),
    "W": _u("watt", "瓦"),
    "V": _u("volt", "伏"),
    "°": _u("degree", "度"),
}
UNITS: dict[str, Unit] = {**SPACED_UNITS, **ATTACHED_UNITS}


class Currency(NamedTuple):
    en: str
    en_plural: str
    en_sub: str | None  # minor unit ("cent") when amounts are read "X dollars and Y cents"
    en_sub_plural: str | None
    zh: str


def _c(en: str, zh: str, plural: str | None = None, sub: str | None = None, sub_plural: str | None = None) -> Currency:
    return Currency(en, plural or en + "s", sub, sub_plural or (sub + "s" if sub else None), zh)


_DOLLAR = _c("dollar", "美元", sub="cent")
_EURO = _c("euro", "欧元", sub="cent")
_POUND = _c("pound", "英镑", sub="penny", sub_plural="pence")
_YEN = _c("yen", "日元", plural="yen")
_YUAN = _c("yuan", "元", plural="yuan")

# ¥ is yen in English and 元 (yuan) in Chinese; ￥ (full width) is yuan in both.
CURRENCY_SYMBOLS: dict[str, tuple[Currency, Currency]] = {  # symbol -> (English reading, Chinese reading)
    "US$": (_c("US dollar", "美元", sub="cent"),) * 2,
    "HK$": (_c("Hong Kong dollar", "港元", sub="cent"),) * 2,
    "NT$": (_c("New Taiwan dollar", "新台币", sub="cent"),) * 2,
    "$": (_DOLLAR, _DOLLAR),
    "€": (_EURO, _EURO),
    "£": (_POUND, _POUND),
    "¥": (_YEN, _YUAN),
    "￥": (_YUAN, _YUAN),
    "₩": (_c("won", "韩元", plural="won"),) * 2,
    "₹": (_c("rupee", "卢比"),) * 2,
}
CURRENCY_CODES: dict[str, Currency] = {
    "USD": _c("US dollar", "美元", sub="cent"),
    "EUR": _EURO,
    "GBP": _POUND,
    "JPY": _YEN,
    "CNY": _YUAN,
    "RMB": _YUAN,
    "HKD": _c("Hong Kong dollar", "港元", sub="cent"),
    "TWD": _c("New Taiwan dollar", "新台币", sub="cent"),
    "CAD": _c("Canadian dollar", "加元", sub="cent"),
    "AUD": _c("Australian dollar", "澳元", sub="cent"),
    "SGD": _c("Singapore dollar", "新加坡元", sub="cent"),
    "CHF": _c("Swiss franc", "瑞士法郎"),
    "KRW": _c("won", "韩元", plural="won"),
    "INR": _c("rupee", "卢比"),
    "RUB": _c("ruble", "卢布"),
}

# Scale words after an amount ("$5 million", "$2.5bn", "€3k"): (English word, power of ten).
SCALES: dict[str, tuple[str, int]] = {
    "thousand": ("thousand", 3), "million": ("million", 6), "billion": ("billion", 9), "trillion": ("trillion", 12),
    "k": ("thousand", 3), "K": ("thousand", 3), "m": ("million", 6), "M": ("million", 6), "mn": ("million", 6),
    "b": ("billion", 9), "B": ("billion", 9), "bn": ("billion", 9), "tn": ("trillion", 12),
    "万": ("", 4), "亿": ("", 8),  # $5万: read as the plain value (fifty thousand dollars / 五万美元)
}
