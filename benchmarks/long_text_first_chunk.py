"""Time to the first audio of a book-length text streamed: planned a block at a time as it is spoken against planned
whole first.

Run: ``python benchmarks/long_text_first_chunk.py [--chars 1000000] [--rounds 2] [--model DIR]``. The text is the
unseen everyday test sentences (``recipes/tiny/lists/everyday_test.txt``) in paragraphs of six, repeated to
``--chars``. ``blocks`` is ``tts.synthesize_stream(text)`` (past ``LAZY_PLAN_CHARS`` it plans ``PLAN_BLOCK_CHARS`` at a
time, ``api/request_batches.py``); ``whole`` streams the same requests planned at once first (``tts.requests``, as
every text was streamed before 2026-12-07). Same process, alternating, best of ``--rounds``; the first chunks are
checked equal. The last line is ``blocks_over_whole_first_chunk: X`` (below 1: sooner).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import cadenza
from cadenza.engine.long_form import stream_segments

SENTENCES = Path(__file__).resolve().parent.parent / "recipes" / "tiny" / "lists" / "everyday_test.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chars", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    lines = [s.strip() for s in SENTENCES.read_text(encoding="utf-8").splitlines() if s.strip()]
    paragraphs, i = [], 0
    while sum(len(p) + 2 for p in paragraphs) < args.chars:
        paragraphs.append(" ".join(lines[(6 * i) % len(lines):(6 * i) % len(lines) + 6]))
        i += 1
    text = "\n\n".join(paragraphs)
    tts = cadenza.load(args.model)
    tts.synthesize("Hello there.", seed=0)

    def blocks():
        stream = tts.synthesize_stream(text, seed=3)
        first = next(stream)
        stream.close()
        return first

    def whole():
        stream = tts.mark.stream(stream_segments(tts.engine.scheduler.submit, tts.requests(text, seed=3)))
        first = next(stream)
        stream.close()
        return first

    best = {"blocks": float("inf"), "whole": float("inf")}
    firsts = {}
    for _ in range(args.rounds):
        for name, fn in (("whole", whole), ("blocks", blocks)):
            t = time.perf_counter()
            firsts[name] = fn()
            best[name] = min(best[name], time.perf_counter() - t)
    assert np.array_equal(firsts["blocks"], firsts["whole"]), "the first chunks differ"
    print(f"{len(text):,} characters: first chunk planned whole {best['whole']:.2f} s, a block at a time "
          f"{best['blocks']:.2f} s (the same samples)")
    print(f"blocks_over_whole_first_chunk: {best['blocks'] / best['whole']:.3f}")


if __name__ == "__main__":
    main()
