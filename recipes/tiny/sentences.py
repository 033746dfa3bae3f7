"""Sentence text for the tiny corpus: the World English Bible (public domain), read from Debian's `sword-text-web`.

Kept: plain ASCII sentences of 5-20 words whose every word is in the system English word list (`wamerican`), so the
corpus avoids rare names that neither the teachers nor the evaluation ASR can pronounce or spell, and has no digits
(spoken digits are normalised differently by every tool). The split into train / test is a fixed function of the
sentence text (a hash), so the 100+ test sentences are never seen in training whatever the corpus size.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

MODULE = "engWEB2015eb"
WORDS = Path("/usr/share/dict/american-english")
_TAG = re.compile(r"<[^>]+>")
_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2014": ", ", "\u2013": "-"})
_SPLIT = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[A-Za-z']+")


def _verses(book_range: str = "Genesis-Revelation") -> list[str]:
    out = subprocess.run(["diatheke", "-b", MODULE, "-f", "plain", "-k", book_range], check=True,
                         capture_output=True, text=True).stdout
    verses = []
    for line in out.splitlines():
        if ":" not in line or line.startswith("("):
            continue
        body = line.split(": ", 1)[1] if ": " in line else ""
        body = _TAG.sub(" ", body.replace("</w><w", "</w> <w")).translate(_QUOTES)
        verses.append(" ".join(body.split()))
    return verses


def _clean(sentence: str) -> str:
    s = sentence.replace('"', "").replace(" ,", ",").replace(" .", ".").replace(" ;", ";").replace(" :", ":")
    s = s.replace(" ?", "?").replace(" !", "!").strip(" ,;:-'")
    return " ".join(s.split())


def english_sentences(min_words: int = 5, max_words: int = 20) -> list[str]:
    """Unique cleaned sentences, in Bible order."""
    vocabulary = {w.strip().lower() for w in WORDS.read_text(encoding="utf-8", errors="ignore").splitlines()}
    seen: set[str] = set()
    kept = []
    for verse in _verses():
        for raw in _SPLIT.split(verse):
            s = _clean(raw)
            if not s or not s[0].isupper() or s[-1] not in ".!?" or not s.isascii() or any(c.isdigit() for c in s) or any(c in s for c in "()[]{}"):
                continue
            words = _WORD.findall(s)
            if not (min_words <= len(words) <= max_words):
                continue
            if any(w.lower().strip("'") not in vocabulary and w.lower().removesuffix("'s") not in vocabulary
                   for w in words):
                continue
            if s.lower() in seen:
                continue
            seen.add(s.lower())
            kept.append(s)
    return kept


def is_test_sentence(sentence: str, test_permille: int = 40) -> bool:
    """A fixed ~4 % of all sentences, chosen by hash of the text, are reserved for evaluation."""
    digest = hashlib.sha256(sentence.lower().encode()).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < test_permille


if __name__ == "__main__":
    sents = english_sentences()
    test = [s for s in sents if is_test_sentence(s)]
    print(len(sents), "sentences,", len(test), "test;", sum(len(s.split()) for s in sents), "words")
    for s in sents[:5] + test[:5]:
        print(" ", s)
