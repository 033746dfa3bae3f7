"""How long a pronunciation lexicon takes to apply: ``Lexicon.apply`` (candidates looked up by the word they start
with) against the baseline of one regex alternation of every entry tried at each character, in the same run.

Run: ``python benchmarks/lexicon_apply.py [--entries 1000] [--chars 5000] [--rounds 5]``. Random lower-case words
as entries (a quarter case-sensitive, some of two words), a text of entries and other words; both methods must give
the same text (checked). Prints the median time of each and ``speedup_over_alternation: X`` last.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import string
import time

from cadenza.text.lexicon import Lexicon, LexiconEntry, _pattern


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--chars", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)

    def word() -> str:
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 10)))

    entries, seen = [], set()
    while len(entries) < args.entries:
        text = word() if rng.random() < 0.8 else f"{word()} {word()}"
        entry = LexiconEntry(text, respelling="x", case_sensitive=rng.random() < 0.25)
        if entry.key not in seen:
            seen.add(entry.key)
            entries.append(entry)
    lexicon = Lexicon(entries)
    order = sorted(range(len(entries)), key=lambda i: (-len(entries[i].word), not entries[i].case_sensitive))
    alternation = re.compile("|".join(f"(?P<e{i}>{_pattern(entries[i])})" for i in order))
    parts: list[str] = []
    while sum(len(p) + 1 for p in parts) < args.chars:
        parts.append(rng.choice(entries).word if rng.random() < 0.2 else word())
    text = " ".join(parts)[: args.chars]

    def baseline() -> str:
        return alternation.sub(lambda m: entries[int(m.lastgroup[1:])].respelling, text)

    assert lexicon.apply(text) == baseline(), "the two methods disagree"
    times = {"alternation": [], "lexicon": []}
    for _ in range(args.rounds):
        for name, fn in (("alternation", baseline), ("lexicon", lambda: lexicon.apply(text))):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"{args.entries} entries over {len(text)} characters, median of {args.rounds} rounds")
    for name, value in medians.items():
        print(f"{name:12s} {value * 1000:9.2f} ms")
    print(f"speedup_over_alternation: {medians['alternation'] / medians['lexicon']:.0f}")


if __name__ == "__main__":
    main()
