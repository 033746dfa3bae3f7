"""The entity patterns: one compiled alternation whose branch order is the priority order.

``ENTITY_RE.finditer`` scans left to right; at each position the first branch that matches wins, so specific forms
(dates, times, phone numbers, money, ranges ...) come before the plain number. ``match.lastgroup`` names the kind.
Every branch that can start at a digit ends at a digit boundary, and the last branch (``number``) matches any digit
run, so no ASCII digit survives a scan. Only ASCII digits count: ``[0-9]``, never ``\\d`` (which matches every script).
"""

from __future__ import annotations

import re

from cadenza.text.normalize.abbreviations import ABBR_PATTERN, ROMAN_CUE_PATTERN, ROMAN_REGNAL_PATTERN
from cadenza.text.normalize.units import ATTACHED_UNITS, CURRENCY_CODES, SPACED_UNITS

NUM_INT = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)"
NUMF = r"[0-9]+(?:\.[0-9]+)?"
MONTHS_FULL = "January|February|March|April|May|June|July|August|September|October|November|December"
MONTHS = MONTHS_FULL + "|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec"


def _alt(words) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


def _num(name: str) -> str:
    """A written number with thousands commas and decimals; groups ``<name>_i`` and ``<name>_f``."""
    return rf"(?P<{name}_i>{NUM_INT})(?:\.(?P<{name}_f>[0-9]+))?"


def _sign(name: str) -> str:
    """An optional sign that is not a hyphen inside a word or a range (``x-2``, ``3-5``)."""
    return rf"(?:(?<![0-9A-Za-z.,])(?P<{name}>[-−+]))?"


CUR_SYM = r"(?:US\$|HK\$|NT\$|[$€£¥￥₩₹])"
CODES = _alt(CURRENCY_CODES)
SCALE = r"(?:thousand|million|billion|trillion|mn|bn|tn|[kKmMbB](?![A-Za-z])|万|亿)(?![A-Za-z])"
SCALE_WORD = r"(?:thousand|million|billion|trillion|mn|bn|[kKMB])"
UNIT = rf"(?:\s?(?:{_alt(SPACED_UNITS)})|(?:{_alt(ATTACHED_UNITS)}))(?![A-Za-z0-9])"
RANGE_SEP = r"(?:\s?[~～–—]\s?|-)"

BRANCHES: list[tuple[str, str]] = [
    ("date_ymd", r"(?<![0-9])(?P<ymd_y>[12][0-9]{3})(?P<ymd_sep>[-/.])(?P<ymd_m>0?[1-9]|1[0-2])(?P=ymd_sep)"
                 r"(?P<ymd_d>0?[1-9]|[12][0-9]|3[01])(?![0-9])"),
    ("date_mdy", r"(?<![0-9/.])(?P<mdy_a>[0-9]{1,2})(?P<mdy_sep>[/.-])(?P<mdy_b>[0-9]{1,2})(?P=mdy_sep)"
                 r"(?P<mdy_y>[0-9]{4})(?![0-9])"),
    ("date_mname", rf"(?<![A-Za-z])(?P<mn_mon>{MONTHS})\.?\s(?P<mn_day>[0-9]{{1,2}})(?:st|nd|rd|th)?(?![0-9A-Za-z])"
                   rf"(?:,?\s(?P<mn_year>[0-9]{{4}})(?![0-9]))?"),
    ("date_my", rf"(?<![A-Za-z])(?P<my_mon>{MONTHS})\.?\s(?P<my_year>[0-9]{{4}})(?![0-9])"),
    # "4 July 1776", "1 Jan", "1st of Sept. 2024": an abbreviation's full stop is taken only before a year (else it
    # may end the sentence).
    ("date_dmn", rf"(?<![0-9])(?P<dm_day>[0-9]{{1,2}})(?:st|nd|rd|th)?\s(?:of\s)?(?P<dm_mon>{MONTHS})"
                 rf"(?![A-Za-z])(?:\.?,?\s(?P<dm_year>[0-9]{{4}})(?![0-9]))?"),
    ("time", r"(?<![0-9:.])(?P<t_h>[01]?[0-9]|2[0-4]):(?P<t_m>[0-5][0-9])(?::(?P<t_s>[0-5][0-9]))?(?![0-9:])"
             r"(?:\s?(?P<t_ap>[AaPp])(?:\.[Mm]\.|[Mm](?![A-Za-z])))?"),
    ("time_ap", r"(?<![0-9.:])(?P<ta_h>1[0-2]|0?[1-9])\s?(?P<ta_ap>[AaPp])(?:\.[Mm]\.|[Mm](?![A-Za-z]))"),
    ("phone", r"\+(?=(?:[^0-9\n]{0,2}[0-9]){7})[0-9]{1,3}(?:[ -]?\([0-9]{1,4}\))?(?:[ -][0-9]{1,5}){1,5}(?![0-9])"
              r"|\+[0-9]{7,15}(?![0-9])"
              r"|(?<![0-9])(?:1[-. ])?(?:\([0-9]{3}\) ?|[0-9]{3}(?P<ph_sep>[-.]))[0-9]{3}[-.][0-9]{4}(?![0-9])"
              r"|(?<![0-9])0[0-9]{2,3}-[0-9]{7,8}(?![0-9])"
              r"|(?<![0-9])1[3-9][0-9](?:-?[0-9]{4}){2}(?![0-9])"
              r"|(?<![0-9])1[3-9][0-9](?: [0-9]{4}){2}(?![0-9])"
              r"|(?<![0-9])[0-9]{3}-[0-9]{4}(?![0-9])"),
    # toll-free numbers spelt with letters: "1-800-FLOWERS", "1-888-GOT-JUNK" (capitals, as they are written)
    # (hyphens only: "800 MB", "800 EUR" are amounts)
    ("vanity", r"(?<![0-9A-Za-z-])(?:(?P<vn_one>1)-)?(?P<vn_area>8(?:00|33|44|55|66|77|88))-"
               r"(?P<vn_word>(?=[A-Z-]{4})[A-Z]{2,}(?:-[A-Z]{2,})*)(?![A-Za-z0-9])"),
    # countdowns, formations, scores: "3-2-1", "4-4-2" (three or more numbers of one or two digits)
    ("dashed", r"(?<![0-9A-Za-z.,/-])(?P<dd>[0-9]{1,2}(?:-[0-9]{1,2}){2,})(?![0-9A-Za-z%°-]|\.[0-9])"),
    # "$-5" (the sign after the symbol), "$.50" (no whole part)
    ("money_sym", rf"{_sign('mo_sign')}(?P<mo_cur>{CUR_SYM})\s?(?P<mo_sign2>[-−])?"
                  rf"(?:{_num('mo')}|\.(?P<mo_cents>[0-9]+))(?:\s?(?P<mo_sc>{SCALE}))?"
                  rf"(?:{RANGE_SEP}{CUR_SYM}?{_num('mo2')}(?:\s?(?P<mo_sc2>{SCALE}))?)?"),
    ("money_code", rf"(?<![A-Za-z])(?P<mc_cur>{CODES})\s?(?P<mc_sign>[-−])?{_num('mc')}(?:\s?(?P<mc_sc>{SCALE}))?"),
    ("money_suffix", rf"{_sign('ms_sign')}{_num('ms')}(?:\s?(?P<ms_sc>{SCALE_WORD}))?\s?"
                     rf"(?P<ms_cur>(?:{CODES})(?![A-Za-z])|[€£¥￥$])"),
    ("expr", rf"(?<![0-9.])(?:(?<![0-9A-Za-z.,])[-−])?{NUMF}"
             rf"(?:\s?[+×÷*=]\s?[-−]?{NUMF}|\s[-−/]\s[-−]?{NUMF})+(?![0-9])"),
    ("range", rf"{_sign('r_sign')}{_num('r_a')}{RANGE_SEP}(?P<r_sign2>[-−])?{_num('r_b')}"
              rf"(?P<r_suf>\s?[%％‰]|{UNIT})?"),
    ("version", r"(?<![0-9.])(?P<v_body>[0-9]+(?:\.[0-9]+){2,})(?!\.?[0-9])"),
    ("percent", rf"{_sign('p_sign')}{_num('p')}\s?(?P<p_sym>[%％‰])"),
    ("decade", r"(?<![0-9])(?P<dc_y>1[0-9]{2}0|20[0-9]0)['’]?s(?![A-Za-z0-9])"
               r"|(?:['’]|(?<=the )|(?<=The )|(?<=mid-)|(?<=early )|(?<=late ))(?P<dc_d>[1-9]0)s(?![A-Za-z0-9])"),
    ("height", r"(?<![0-9.,'’′])(?P<ht_ft>[1-9])\s?['’′]\s?(?P<ht_in>1[01]|[0-9])(?![0-9]|\.[0-9])(?:\"|”|″|'')?"),
    ("measure", rf"{_sign('u_sign')}{_num('u')}(?P<u_unit>{UNIT})"),
    ("ordinal", rf"(?<![0-9])(?P<o_i>{NUM_INT})(?P<o_suf>st|nd|rd|th|ST|ND|RD|TH)(?![A-Za-z0-9])"),
    ("dims", rf"(?P<x_a>{NUMF})\s?[xX×]\s?(?P<x_b>{NUMF})(?:\s?[xX×]\s?(?P<x_c>{NUMF}))?(?![0-9])"),
    ("times", rf"(?P<mul>{NUMF})[xX×](?![A-Za-z0-9])"),
    ("fraction", r"(?<![0-9/.])(?:(?P<f_w>[0-9]{1,3}) )?(?P<f_n>[0-9]+)/(?P<f_d>[0-9]+)(?![0-9/])"),
    ("vulgar", r"(?:(?P<vf_w>[0-9]+) ?)?(?P<vf>[½⅓⅔¼¾⅕⅖⅗⅘⅙⅚⅛⅜⅝⅞])"),
    ("ratio", r"(?<![0-9:])(?P<ra_a>[0-9]+):(?P<ra_b>[0-9]+)(?![0-9:])"),
    # Look-arounds test letters only (a digit beside becomes a word and a space: "5C#" must not flip on a second pass).
    ("tech", r"(?<![A-Za-z#])(?P<tk>[CF]#)(?![A-Za-z#])|(?<![A-Za-z#.])(?P<tk2>\.NET)(?![A-Za-z])"),
    ("hash", r"#(?P<h_n>[0-9]+)(?![0-9])"),
    ("number_no", r"(?<![A-Za-z])(?:No|NO)\.\s?(?P<no_n>[0-9]+)(?![0-9])"),
    ("roman_cue", ROMAN_CUE_PATTERN),
    ("roman_regnal", ROMAN_REGNAL_PATTERN),
    ("abbr", ABBR_PATTERN),
    ("amp", r"&"),
    ("math_sym", r"(?P<sym_c>[≈≥≤≠±])(?=\s?[-−]?[0-9])"),
    # "<", ">", "<=", ">=" (not in arrows "->", "=>", "<=>", "<>", nor "<<", ">>"); operators.py decides whether the
    # neighbours make it a comparison
    ("compare", r"(?<![-=<>!])(?P<cmp_op>[<>]=?)(?![<>=])"),
    # "2^10", "x^2", "10^-3"
    ("power", r"(?<=[^\s^])\^(?P<pw_e>[-−]?[0-9]+(?:\.[0-9]+)?(?![0-9])|[A-Za-z](?![A-Za-z]))"),
    ("number", rf"{_sign('n_sign')}(?P<n_i>{NUM_INT})(?:\.(?P<n_f>[0-9]+))?"),
    ("point", r"(?<![0-9A-Za-z])\.(?P<pt_f>[0-9]+)"),
]

ENTITY_RE = re.compile("|".join(f"(?P<{name}>{body})" for name, body in BRANCHES))
KINDS = tuple(name for name, _ in BRANCHES)
NUMBER_RE = re.compile(r"(?P<i>[0-9]+)(?:\.(?P<f>[0-9]+))?")  # fallback: every digit run, read as a number
