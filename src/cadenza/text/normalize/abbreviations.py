"""English abbreviations and Roman numerals (always read in English: they are Latin-script words).

Roman numerals are read only where unambiguous: after a cue word (``Chapter IV`` -> Chapter four, ``World War II``
-> World War two, ``Super Bowl LVIII``) or after a regnal name (``Henry VIII`` -> Henry the eighth). A lone ``I`` is
never read as one except as ``War I`` or in ``<Name> I`` at the end of a phrase (``Elizabeth I.``, ``Elizabeth I of
England``), so the pronoun is safe; lone ``L``/``C``/``D``/``M`` are letters (``Class C``, ``Appendix D``).
"""

from __future__ import annotations

import re

from cadenza.text.normalize import en_numbers

ROMAN = r"(?=[MDCLXVI])M{0,3}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})"
ROMAN_REGNAL = r"(?=[IVX])X{0,3}(?:IX|IV|V?I{0,3})"  # up to XXXIX: "Peter MD" is not Peter the 1500th
_ROMAN_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}

_CUES = (
    "Chapter|Part|Volume|Vol\\.|Book|Act|Scene|Section|Article|Appendix|Phase|Stage|Level|Class|Type|War|Bowl|"
    "Episode|Season|Psalm|Unit|Lesson|Round|Title|Annex|Schedule|Grade|Tier|Mark|Series|Fantasy|Apollo|"
    "chapter|part|volume|book|act|scene|section|article|appendix|phase|stage|level|class|type|episode|season|unit|"
    "lesson|round|grade|tier"
)
_NAMES = (
    "Henry|Louis|Edward|George|William|Charles|James|Richard|John|Elizabeth|Mary|Anne|Philip|Frederick|Peter|"
    "Catherine|Nicholas|Alexander|Ivan|Ferdinand|Leopold|Francis|Gregory|Benedict|Pius|Leo|Paul|Clement|Innocent|"
    "Urban|Boniface|Sixtus|Felipe|Carlos|Juan|Alfonso|Gustav|Gustavus|Christian|Olaf|Haakon|Harald|Ramesses|Ramses|"
    "Thutmose|Amenhotep|Ptolemy|Constantine|Justinian|Napoleon|Wilhelm|Otto|Rudolf|Maximilian|Sigismund|Casimir|"
    "Victor Emmanuel|Umberto|Rama|Selim|Mehmed|Suleiman|Murad|Frederick William"
)
# Look-arounds test only letters: digits next to these become words, and the decision must not flip in a second pass.
# "Vol.IV" too: its abbreviation is read "Volume", which a second pass would take for a cue.
ROMAN_CUE_PATTERN = rf"(?<![A-Za-z])(?P<rc_cue>{_CUES})(?P<rc_sp>\s|(?<=Vol\.))(?P<rc_num>{ROMAN})(?![A-Za-z])"
ROMAN_REGNAL_PATTERN = rf"(?<![A-Za-z])(?P<rr_name>{_NAMES})(?P<rr_sp>\s)(?P<rr_num>{ROMAN_REGNAL})(?![A-Za-z])"

# Titles and the like: never end a sentence, the period is dropped.
_TITLES = {
    "Dr": "Doctor", "Mr": "Mister", "Mrs": "Missus", "Ms": "Miz", "Prof": "Professor", "Mt": "Mount",
    "Gen": "General", "Capt": "Captain", "Lt": "Lieutenant", "Sgt": "Sergeant", "Col": "Colonel", "Gov": "Governor",
    "Sen": "Senator", "Rev": "Reverend", "Hon": "Honorable", "Fig": "Figure", "Vol": "Volume",
    "approx": "approximately", "vs": "versus", "e.g.": "for example", "i.e.": "that is", "E.g.": "For example",
    "I.e.": "That is", "Approx": "Approximately", "Vs": "Versus",  # capitalised where a sentence or a title starts
}
# May end a sentence: the period is kept when a new sentence (or the text's end) follows.
_FINAL = {
    "etc": "et cetera", "Etc": "Et cetera", "Jr": "Junior", "Sr": "Senior", "Inc": "Incorporated", "Ltd": "Limited",
    "Corp": "Corporation", "Co": "Company", "Ave": "Avenue", "Blvd": "Boulevard", "Rd": "Road", "Dept": "Department",
    "St": "Street",
}
# A bare "vs" before anything but a letter: "vs0", "vs&", "vs¼" spelt "vs zero", "vs and", ... would be read
# "versus ..." on a second pass.
_WORDS = "|".join(sorted((k for k in (*_TITLES, *_FINAL) if "." not in k), key=len, reverse=True))
ABBR_PATTERN = (
    rf"(?<![A-Za-z])(?P<ab>[eE]\.g\.|[iI]\.e\.|(?:{_WORDS})\.(?![a-z])|(?:Mrs|Mr|Ms|Dr)(?=\s[A-Z])|vs(?![A-Za-z]))"
)

_SENTENCE_FOLLOWS = re.compile(r"\s*$|\s*\n|\s+[A-Z\u4e00-\u9fff]")
_NEXT_CAPITAL = re.compile(r"\s+[A-Z]")
_PREV_WORD = re.compile(r"([A-Za-z0-9]+)\s*$")
_FUNCTION_CAPS = frozenset("The A An In At On To From Of And Or But For With By Visit Near".split())
_I_OK_AFTER = re.compile(r"\s*$|\s*[.,;:!?)\]\n&]|\s+(?:of|and)\b")  # "&" becomes "and"


def roman_value(s: str) -> int:
    total = 0
    for ch, nxt in zip(s, (*s[1:], "")):
        v = _ROMAN_VALUES[ch]
        total += -v if nxt and _ROMAN_VALUES[nxt] > v else v
    return total


def _single_letter_ok(m: re.Match, numeral: str, cue: str) -> bool:
    if set(numeral) <= set("CDM"):
        return False  # "Class C", "Type CD", "Section DC" are letters
    if len(numeral) > 1:
        return True
    if numeral == "L":
        return False
    if numeral == "I":
        return cue == "War" or (cue[0].isupper() and _I_OK_AFTER.match(m.string, m.end()) is not None)
    return True


def render_roman_cue(m: re.Match) -> str | None:
    cue, numeral = m.group("rc_cue"), m.group("rc_num")
    if not _single_letter_ok(m, numeral, cue):
        return None
    space = m.group("rc_sp")
    if cue == "Vol.":
        cue, space = "Volume", space or " "  # the cue's own abbreviation is read too ("Vol. IV" -> Volume four)
    return cue + space + en_numbers.cardinal(roman_value(numeral))


def render_roman_regnal(m: re.Match) -> str | None:
    name, numeral = m.group("rr_name"), m.group("rr_num")
    if numeral == "I" and _I_OK_AFTER.match(m.string, m.end()) is None:
        return None
    return name + m.group("rr_sp") + "the " + en_numbers.ordinal(roman_value(numeral))


def render_abbr(m: re.Match) -> str:
    raw = m.group("ab")
    word = raw[:-1] if raw.endswith(".") and raw not in _TITLES else raw
    if word in _TITLES:
        return _TITLES[word]
    text, end = m.string, m.end()
    if word == "St":
        prev = _PREV_WORD.search(text, 0, m.start())
        prev_cap = prev is not None and (prev.group(1)[0].isupper() or prev.group(1)[0].isdigit())
        if _NEXT_CAPITAL.match(text, end) and not (prev_cap and prev.group(1) not in _FUNCTION_CAPS):
            return "Saint"
    reading = _FINAL[word]
    return reading + "." if _SENTENCE_FOLLOWS.match(text, end) else reading
