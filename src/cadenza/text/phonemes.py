"""Text -> IPA phonemes with espeak-ng, and the phoneme text tokenizer of a model folder (``phonemes.json``).

A model whose LM reads phonemes instead of BPE (cadenza-tiny, docs/cadenza-tiny.md) carries
``CosyVoice-BlankEN/phonemes.json``::

    {"backend": "espeak-ng", "language": "en-us", "symbols": ["_", "^", "$", " ", ",", ".", ..., "ə", "ˈ", ...]}

The engine then turns normalised text into espeak-ng IPA (one symbol per Unicode code point after NFD, so
``"oʊ"`` is two symbols and stress marks are symbols of their own, as Piper does), keeps clause punctuation and
word spaces as symbols, and maps each symbol to its index in ``symbols``. The same code phonemises the training
corpus (``recipes/tiny``), so training and inference cannot disagree.

espeak-ng comes from the ``espeakng-loader`` wheel (its shared library and data; eSpeak NG is GPL-3.0 and is
loaded at run time, not linked). The library is not thread-safe: every call holds one process-wide lock.
"""

from __future__ import annotations

import ctypes
import functools
import json
import re
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from cadenza.errors import CheckpointError, InputError, MissingDependencyError, TextError
from cadenza.text.lexicon import PHONEME_SPAN, Lexicon, check_phonemes
from cadenza.text.qwen_tokenizer import COSYVOICE2_SPECIAL_TOKENS, ENDOFTEXT

PHONEMES_FILE = "phonemes.json"
# Clause punctuation kept as symbols (espeak-ng's own clause terminators): a pause the model can learn.
_CLAUSE = re.compile(r"([,.;:!?]+)")
_PAREN_FLAGS = re.compile(r"\([^)]*\)")  # espeak's language-switch flags such as "(fr)": not phonemes
_IPA_MODE = 0x02  # espeak_TextToPhonemes phonememode: IPA as UTF-8, no separator between phonemes
_lock = threading.Lock()
_espeak: _Espeak | None = None


class _Espeak:
    """The espeak-ng shared library of ``espeakng-loader``, initialised once per process."""

    def __init__(self) -> None:
        try:
            import espeakng_loader
        except ImportError as exc:
            raise MissingDependencyError(
                "this model reads phonemes: install espeak-ng's loader with `pip install espeakng-loader` "
                "(a dependency of cadenza; it ships the espeak-ng library and data)") from exc
        lib = ctypes.cdll.LoadLibrary(espeakng_loader.get_library_path())
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int]
        data = str(espeakng_loader.get_data_path()).encode()
        # 0x02: AUDIO_OUTPUT_SYNCHRONOUS (no audio device); 0x8000: espeakINITIALIZE_DONT_EXIT (no exit() on error).
        if lib.espeak_Initialize(0x02, 0, data, 0x8000) <= 0:
            raise MissingDependencyError(f"espeak-ng failed to initialise with its data at {data.decode()}")
        self.lib = lib
        self.voice: str | None = None

    def clause_ipa(self, text: str, language: str) -> str:
        """IPA of ``text`` (clauses joined by spaces); the caller holds ``_lock``."""
        if self.voice != language:
            if self.lib.espeak_SetVoiceByName(language.encode()) != 0:
                raise TextError(f"espeak-ng has no voice for language {language!r}")
            self.voice = language
        buf = ctypes.c_char_p(text.encode("utf-8"))
        ptr = ctypes.pointer(buf)
        parts = []
        while ptr.contents.value:  # espeak advances the pointer clause by clause; NULL/empty when done
            out = self.lib.espeak_TextToPhonemes(ptr, 1, _IPA_MODE)  # 1: espeakCHARS_UTF8
            if out:
                parts.append(out.decode("utf-8").strip())
        return " ".join(p for p in parts if p)


def phonemize(text: str, language: str = "en-us") -> list[str]:
    """Normalised text -> IPA symbols (NFD code points), clause punctuation and word spaces kept.

    ``"Hello there, friend."`` -> ``['h', 'ə', 'l', 'ˈ', 'o', 'ʊ', ' ', 'ð', 'ˈ', 'ɛ', 'ɹ', ',', ' ', ...]``.
    """
    global _espeak
    symbols: list[str] = []
    pieces = _CLAUSE.split(text)
    with _lock:
        if _espeak is None:
            _espeak = _Espeak()
        for i in range(0, len(pieces), 2):
            clause = pieces[i].strip()
            punct = pieces[i + 1][0] if i + 1 < len(pieces) else ""
            ipa = _PAREN_FLAGS.sub("", _espeak.clause_ipa(clause, language)) if clause else ""
            ipa = re.sub(r"\s+", " ", ipa).strip()
            if not ipa:
                continue
            if symbols and symbols[-1] not in (" ",):
                symbols.append(" ")
            symbols.extend(unicodedata.normalize("NFD", ipa))
            if punct:
                symbols.append(punct)
    while symbols and symbols[-1] == " ":
        symbols.pop()
    return symbols


@dataclass(frozen=True)
class PhonemeTable:
    """``phonemes.json``: the espeak-ng language, the symbol list (a symbol's index is its text token id) and the
    model's own pronunciations (``"lexicon"``: entries as a request's lexicon takes them, docs/text.md) for words
    espeak-ng says wrong; a request's or a saved voice's lexicon is applied first and wins."""

    symbols: tuple[str, ...]
    language: str = "en-us"
    backend: str = "espeak-ng"
    lexicon: Lexicon | None = None

    def __post_init__(self) -> None:
        if self.backend != "espeak-ng":
            raise CheckpointError(f"{PHONEMES_FILE}: unknown phoneme backend {self.backend!r} (only 'espeak-ng')")
        if not self.symbols or len(set(self.symbols)) != len(self.symbols):
            raise CheckpointError(f"{PHONEMES_FILE}: 'symbols' must be a non-empty list without repeats")
        for entry in self.lexicon.entries if self.lexicon else ():
            if entry.phonemes is not None:
                try:
                    check_phonemes(entry.phonemes, self.symbols, f"{PHONEMES_FILE} lexicon entry {entry.word!r}")
                except InputError as exc:
                    raise CheckpointError(str(exc)) from None

    @classmethod
    def read(cls, path: str | Path) -> PhonemeTable:
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
            lexicon = Lexicon.from_json(raw["lexicon"], f"{PHONEMES_FILE} lexicon") if "lexicon" in raw else None
            return cls(symbols=tuple(raw["symbols"]), language=str(raw.get("language", "en-us")),
                       backend=str(raw.get("backend", "espeak-ng")), lexicon=lexicon)
        except (OSError, ValueError, KeyError, TypeError, InputError) as exc:
            raise CheckpointError(f"cannot read the phoneme table {path}: {exc}") from exc

    def write(self, path: str | Path) -> None:
        raw: dict = {"backend": self.backend, "language": self.language, "symbols": list(self.symbols)}
        if self.lexicon:
            raw["lexicon"] = self.lexicon.to_json()["entries"]
        Path(path).write_text(json.dumps(raw, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")


class PhonemeTokenizer:
    """Text -> phoneme ids through espeak-ng (same interface as the Qwen2 tokenizer: ``encode(text) -> ids``).

    Symbols espeak produces that the table lacks are dropped (a model cannot say what it never saw).
    """

    # Segments hold at most this many ids, whatever budget a caller sized for BPE asks for: our recipe's LM learnt
    # sentences of 5-20 words (<= ~110 ids) and skips words in longer ones (2026-12-07, the built-in model: 30
    # sentences of 11-43 words, 3 seeds, kept 86.7 % of their phones with segments of up to 240 ids, 97.6 % with 120,
    # 99.1 % with 100). Longer sentences are cut at clause marks, else between words (docs/text.md).
    segment_tokens = 100
    # A phoneme LM of our recipe learnt from one sentence per utterance: it ends its speech at the first sentence end
    # its minimum length allows, so two sentences in one segment lose the second. Each sentence is a segment of its own.
    one_sentence_per_segment = True

    def __init__(self, table: PhonemeTable) -> None:
        self.table = table
        self.index = {s: i for i, s in enumerate(table.symbols)}
        # A long text's sentences are read by the segmenter (counted) and again as the requests' ids: espeak-ng runs
        # once per distinct text (a pure function of the text and the table).
        self._ids = functools.lru_cache(maxsize=8192)(self._read_ids)

    @classmethod
    def from_dir(cls, directory: str | Path) -> PhonemeTokenizer:
        return cls(PhonemeTable.read(Path(directory) / PHONEMES_FILE))

    def symbols(self, text: str) -> list[str]:
        """Symbols of ``text`` the table has; inline phoneme spans ``<|ph:IPA|>`` (SSML ``<phoneme>``, lexicon
        entries: ``cadenza.text.lexicon``, the table's own lexicon) are taken symbol for symbol instead of being
        read by espeak-ng, and a possessive right after one is said as English says it (``Cadenza's``: /z/)."""
        if self.table.lexicon:
            text = self.table.lexicon.apply(text, self.table.symbols, description=False)
        out: list[str] = []
        pos = 0
        for m in PHONEME_SPAN.finditer(text):
            self._read(out, text[pos:m.start()])
            if out and out[-1] != " " and text[pos:m.start()][-1:].isspace():
                out.append(" ")
            ipa = unicodedata.normalize("NFD", m.group(1))
            out.extend(ipa)
            pos = m.end()
            if possessive := _POSSESSIVE.match(text, pos):  # espeak-ng reads a lone "'s" as the letter ("ɛs")
                out.extend(_possessive_ending(ipa))
                pos = possessive.end()
        self._read(out, text[pos:])
        return [s for s in out if s in self.index]

    def _read(self, out: list[str], text: str) -> None:
        """Append the phonemes of ``text`` (a piece next to phoneme spans) to ``out``: clause punctuation right
        after a span stays (espeak drops a clause with no words), a word space where the text has one."""
        text = drop_tags(text)
        lead = _CLAUSE.match(text.lstrip())
        if lead and out:
            out.append(lead.group()[0])
            text = text.lstrip()[lead.end():]
        if self.table.language.startswith("en"):
            check_latin_letters(text, self.table.language)
        text = spell_inner_marks(spell_initials(drop_emoji(text)))
        symbols = phonemize(text, self.table.language) if text.strip() else []
        if symbols and out and out[-1] != " " and text[:1].isspace():
            out.append(" ")
        out.extend(symbols)

    def encode(self, text: str) -> list[int]:
        return list(self._ids(text))

    def check_script(self, text: str) -> None:
        """Raise the ``TextError`` that ``encode(text)`` would for a letter of another script, without reading the
        text: what the lexicon respells and phoneme spans are not letters to read."""
        if not self.table.language.startswith("en") or other_script_at(text) is None:
            return
        if self.table.lexicon:
            text = self.table.lexicon.apply(text, self.table.symbols, description=False)
        check_latin_letters(PHONEME_SPAN.sub(" ", text), self.table.language)

    def _read_ids(self, text: str) -> tuple[int, ...]:
        return tuple(self.index[s] for s in self.symbols(text))

    def count_piece(self, text: str) -> int:
        """The ids ``text`` adds to a segment it joins (the segmenter's count): a piece that starts with a space
        is read after a word, so the word space is an id too (``encode`` of the piece alone drops it; counted
        without it, the pieces of a long sentence summed to 98 ids where the sentence has 114). Leading space
        changes nothing else that ``encode`` reads, so the piece is read without it (one espeak-ng run with the
        segment's own text)."""
        return len(self._ids(text.lstrip())) + (1 if text[:1].isspace() and text.strip() else 0)

    def ending_a_sentence(self, ids: list[int]) -> list[int]:
        """``ids`` of a whole segment ending as a sentence does: a final clause mark (``,`` ``;`` ``:``: a sentence
        cut there to fit the budget, or one the segmenter ends at ``;``) read as a full stop, and a full stop added
        where the segment has no final mark (a heading, a list item, a line without one). An LM trained on one
        sentence per utterance does not stop cleanly otherwise: "She finished first and he came second;" ran on for
        6 s repeating its last words (two seeds, ``,`` and ``:`` alike; with ``.`` it is 2 s of the sentence), and
        "Chapter three: The Beginning" was 2.0-2.1 s with a made-up word after it (three seeds; with ``.`` 1.4-1.7 s,
        every word and nothing else)."""
        stop = self.index.get(".")
        if not ids or stop is None:
            return ids
        last = self.table.symbols[ids[-1]]
        if last in (".", "?", "!"):
            return ids
        if last in (",", ";", ":"):
            return [*ids[:-1], stop]
        return [*ids, stop]

    def stream_encoder(self) -> PhonemeStreamEncoder:
        return PhonemeStreamEncoder(self)


_POSSESSIVE = re.compile(r"['\u2019]s(?!\w)")
_SIBILANTS = ("s", "z", "ʃ", "ʒ")
_VOICELESS = ("p", "t", "k", "f", "θ")


def _possessive_ending(ipa: str) -> str:
    """The ``'s`` after a word ending in ``ipa``: /ɪz/ after a sibilant, /s/ after another voiceless consonant,
    else /z/ (``Cadenza's``, ``NGINX's``, ``Kurt's``)."""
    last = ipa.rstrip("ːˈˌ ")[-1:]
    return "ɪz" if last in _SIBILANTS else "s" if last in _VOICELESS else "z"


_DOTTED_LETTERS = re.compile(r"(?<![\w.])(?:[A-Za-z]\.){2,}")  # "U.S.A.", "e.g."
_INITIAL = re.compile(r"(?<![\w.])([A-Z])\.(?=\s+[A-Z])")  # "J. K. Rowling"
_TRAILING_INITIALS = re.compile(r"(?<![\w.])(?:[A-Za-z]\.\s*)+$")
# Clause punctuation inside a word ("example.com", "https://", "a?b=c"): read out, not a pause or an end.
_INNER_MARK = re.compile(r"(?<=\w)([.?!:;])(?=[\w/])")
_MARK_WORDS = {".": "dot", "?": "question mark", "!": "exclamation mark", ":": "colon", ";": "semicolon"}


@functools.lru_cache(maxsize=4096)
def _latin_or_greek(letter: str) -> bool:
    name = unicodedata.name(letter, "")
    return "LATIN" in name or "GREEK" in name or name.startswith("MODIFIER")


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def other_script_at(text: str) -> int | None:
    """Index of the first letter of ``text`` that is neither Latin nor Greek, else None. Only non-ASCII characters
    are looked at (every ASCII letter is Latin), so a million characters of English take milliseconds."""
    for m in _NON_ASCII.finditer(text):
        c = m.group()
        if c.isalpha() and not _latin_or_greek(c):
            return m.start()
    return None


def check_latin_letters(text: str, language: str) -> None:
    """Raise ``TextError`` naming the first letter of ``text`` that is not Latin (or Greek: espeak-ng names Greek
    letters). espeak-ng's English voice reads other scripts as their script's name ("你好" -> "Chinese letter
    Chinese letter", Arabic letter by letter), which an English model then says instead of the text."""
    i = other_script_at(text)
    if i is not None:
        c = text[i]
        raise TextError(f"this model reads {language} (Latin letters); {c!r} ({unicodedata.name(c, 'unnamed')}) at "
                        f"character {i} of {text[:60]!r} is another script: use a model for its language "
                        "(e.g. CosyVoice2-0.5B)")


# Emoji and pictographs (with their joiners, variation selectors, keycaps, skin tones and flag tags): espeak-ng reads
# each by its name ("Done ✅" -> "done white heavy check mark"), which no reader of the text would say.
_EMOJI = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\uFE0E\uFE0F\u200D\u20E3\U000E0020-\U000E007F]+ ?")


# Markup a phoneme model cannot perform and espeak-ng would read as words ("<strong>" -> "strong", "</b>" -> "slash
# b"): CosyVoice 2's special tokens and instruct tags, any other <|...|> token (phoneme spans <|ph:...|> are taken
# out before this runs), and HTML/XML tags (<b>, </i>, <br/>, <span class="x">; <strong>, <laughter>).
_UNSPOKEN_TAG = re.compile(
    "|".join(re.escape(t) for t in sorted((*COSYVOICE2_SPECIAL_TOKENS, ENDOFTEXT), key=len, reverse=True))
    + r"|<\|[^|\n]*\|>"
    + r"|</?[A-Za-z][A-Za-z0-9_-]*(?:\s+[A-Za-z_:][\w:.-]*(?:\s*=\s*(?:\"[^\"<>]*\"|'[^'<>]*'|[^\s\"'<>=]+))?)*\s*/?>"
)
_SPACES = re.compile(r"[ \t]{2,}")


def drop_tags(text: str) -> str:
    """``text`` without the markup a phoneme model cannot perform (its words stay): ``"Hello <strong>there</strong>."``
    -> ``"Hello there."``, ``"Hello [laughter] there."`` -> ``"Hello there."``, ``"Hello<|endoftext|>world"`` ->
    ``"Hello world"`` (a tag between two letters or digits leaves a space). Unknown ``[word]`` tags stay words."""
    if "<" not in text and "[" not in text:
        return text

    def gap(m: re.Match) -> str:
        before, after = text[m.start() - 1 : m.start()], text[m.end() : m.end() + 1]
        return " " if before.isalnum() and after.isalnum() else ""

    dropped = _UNSPOKEN_TAG.sub(gap, text)
    return _SPACES.sub(" ", dropped) if dropped != text else text


def drop_emoji(text: str) -> str:
    """``text`` without emoji and pictographs (and one space after each run), for espeak-ng: ``"Done ✅"`` ->
    ``"Done "``, ``"I love it 😀."`` -> ``"I love it ."``. Other symbols (``©``, ``→``) are read as before."""
    return _EMOJI.sub("", text)


def spell_initials(text: str) -> str:
    """Initialisms without their full stops: ``"the U.S.A. border"`` -> ``"the USA border"`` (espeak-ng spells a
    short capitalised word letter by letter), ``"J. K. Rowling"`` -> ``"J K Rowling"``; a full stop that ends the
    text stays (``"in the U.S."`` -> ``"in the US."``). espeak-ng, and so the phonemes, keep every full stop as a
    clause end, and an LM trained on one sentence per utterance ends its speech at a sentence end."""

    def letters(m: re.Match) -> str:
        spelled = m.group().replace(".", "").upper()
        return spelled + "." if not text[m.end():].strip() else spelled

    return _INITIAL.sub(r"\1", _DOTTED_LETTERS.sub(letters, text))


def spell_inner_marks(text: str) -> str:
    """Clause marks inside a word read out: ``"example.com"`` -> ``"example dot com"``, ``"https://x"`` -> ``"https
    colon //x"``, ``"a?b"`` -> ``"a question mark b"``; espeak-ng would keep each as a clause end (see
    :func:`spell_initials`)."""
    return _INNER_MARK.sub(lambda m: f" {_MARK_WORDS[m.group(1)]} ", text)


def _last_break(text: str) -> int:
    """Index of the last space or clause punctuation of ``text`` outside inline phoneme spans (``<|ph:...|>``, which
    hold ``:`` and may hold spaces; one not closed yet counts to the end), or -1."""
    spans = [m.span() for m in PHONEME_SPAN.finditer(text)]
    opened = text.rfind("<|")
    if opened >= 0 and text.find("|>", opened) < 0:
        spans.append((opened, len(text)))
    for i in range(len(text) - 1, -1, -1):
        if text[i] in " \n,.;:!?" and not any(a <= i < b for a, b in spans):
            return i
    return -1


class PhonemeStreamEncoder:
    """Text pieces as they arrive (e.g. an upstream LLM's tokens) -> phoneme ids, a whole word at a time.

    A word's pronunciation depends on all its letters ("Hel" + "lo"), so text is held back up to the last space or
    clause punctuation; ``flush`` encodes the rest at the end of the stream.
    """

    def __init__(self, tokenizer: PhonemeTokenizer) -> None:
        self.tokenizer = tokenizer
        self.pending = ""

    def feed(self, piece: str) -> list[int]:
        self.pending += piece
        cut = _last_break(self.pending)
        if cut < 0:
            return []
        ready, self.pending = self.pending[: cut + 1], self.pending[cut + 1:]
        if initials := _TRAILING_INITIALS.search(ready):  # "in the U." may go on as "S. Army": wait and see
            ready, self.pending = ready[: initials.start()], ready[initials.start():] + self.pending
        ids = self.tokenizer.encode(ready) if ready.strip() else []
        # A word space between two pieces belongs to the stream: keep one after every completed chunk.
        space = self.tokenizer.index.get(" ")
        if ids and space is not None and ids[-1] != space:
            ids.append(space)
        return ids

    def flush(self) -> list[int]:
        ready, self.pending = self.pending, ""
        return self.tokenizer.encode(ready) if ready.strip() else []
