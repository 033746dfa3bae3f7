"""Time to plan a long text before its first audio: the segmenter's and the phoneme tokenizer's caches against none.

Run: ``python benchmarks/long_text_planning.py [--sentences 2000] [--rounds 3] [--model DIR]``. The text is the
unseen everyday test sentences (``recipes/tiny/lists/everyday_test.txt``) repeated to ``--sentences``, in paragraphs of
six. Planning (``tts.requests``: normalisation, segmentation, each segment's ids and request) is what a long text
waits for before its first segment is submitted; with the built-in model every sentence is phonemised by espeak-ng,
and before 2026-12-07 the segmenter asked for each sentence's count three times and the requests read it again.
``uncached`` puts both counts back (``_Splitter.count`` calls the counter every time, the tokenizer's ids are read
afresh each call) in the same process; the segments are checked equal. Best of ``--rounds`` each, alternating; the
last line is ``cached_over_uncached_planning: X`` (below 1: faster).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import cadenza
from cadenza.text import segment

SENTENCES = Path(__file__).resolve().parent.parent / "recipes" / "tiny" / "lists" / "everyday_test.txt"


@contextlib.contextmanager
def uncached(tts):
    """The counts as they were: every call reaches the counter, every encode runs espeak-ng."""
    tokenizer = tts.engine.frontend.tokenizer
    phonemes = hasattr(tokenizer, "_read_ids")  # the phoneme tokenizer's cache (a BPE one has none)
    count, ids = segment._Splitter.count, getattr(tokenizer, "_ids", None)
    segment._Splitter.count = lambda self, text: self._counter(text)
    if phonemes:
        tokenizer._ids = tokenizer._read_ids
    try:
        yield
    finally:
        segment._Splitter.count = count
        if phonemes:
            tokenizer._ids = ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=None, help="a model folder (default: the built-in cadenza-tiny)")
    args = parser.parse_args()
    lines = [line.strip() for line in SENTENCES.read_text(encoding="utf-8").splitlines() if line.strip()]
    chosen = (lines * (args.sentences // len(lines) + 1))[: args.sentences]
    text = "\n\n".join(" ".join(chosen[i : i + 6]) for i in range(0, len(chosen), 6))
    tts = cadenza.load(args.model)
    tokenizer = tts.engine.frontend.tokenizer
    print(f"{len(chosen)} sentences, {len(text)} characters; model {tts.directory}")
    best = {"cached": float("inf"), "uncached": float("inf")}
    planned = {}
    for _ in range(args.rounds):
        for way in ("uncached", "cached"):
            if hasattr(tokenizer, "_read_ids") and way == "cached":
                tokenizer._ids.cache_clear()  # each round starts cold, as a new text does
            with uncached(tts) if way == "uncached" else contextlib.nullcontext():
                start = time.perf_counter()
                requests = tts.requests(text, seed=1)
                best[way] = min(best[way], time.perf_counter() - start)
            planned[way] = [r.text_ids.tolist() for r in requests]
    assert planned["cached"] == planned["uncached"], "the caches changed what is planned"
    for way, seconds in best.items():
        print(f"{way}: {seconds:.2f} s to plan {len(planned[way])} segments")
    print(f"cached_over_uncached_planning: {best['cached'] / best['uncached']:.3f}")


if __name__ == "__main__":
    main()
