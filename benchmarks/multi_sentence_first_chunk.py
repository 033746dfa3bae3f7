"""Several sentences streamed: first-chunk latency and playback stalls with the next sentence started once the first
has sent audio (the default) against both started together (the baseline), in the same run.

Run: ``python benchmarks/multi_sentence_first_chunk.py [--repeats 3] [--threads 2] [--model DIR]`` (default: the
built-in model). Each repeat streams every text below once per mode, alternating, with the same seed in both modes
(the same audio: segments do not change with when they run). A stall is time a player reading the chunks in order
would have waited: a chunk arriving after the audio before it had played out. The headline line comes last:
``staggered_over_together_first_chunk: X`` (median first chunk, staggered / together).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from playback import play

import cadenza
from cadenza.engine.long_form import stream_segments

TEXTS = (
    "Sure, I can help you with that. What time would you like to book the table for?",
    "Yes. I can do that for you tomorrow morning.",
    "The train leaves at nine. It takes about two hours to get there, so bring a book. Call me when you arrive.",
    "Hi! How are you doing today? I hope the weather is nice where you are.",
    "Okay. Thanks. Bye!",
)


def stream_once(tts, text: str, seed: int, stagger: bool) -> tuple[float, float]:
    """(first chunk s, stall s) of one streamed text."""
    requests = tts.requests(text, seed=seed)
    return play(stream_segments(tts.engine.scheduler.submit, requests, stagger=stagger), tts.sample_rate)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    tts = cadenza.load(a.model)
    try:
        tts.synthesize("Warm up. Twice.", seed=0)
        results = {True: ([], []), False: ([], [])}
        for r in range(a.repeats):
            for i, text in enumerate(TEXTS):
                for stagger in (True, False):
                    first, stall = stream_once(tts, text, seed=100 * r + i, stagger=stagger)
                    results[stagger][0].append(first)
                    results[stagger][1].append(stall)
        for stagger, name in ((False, "together (baseline)"), (True, "staggered (default)")):
            firsts, stalls = results[stagger]
            print(f"{name}: first chunk median {statistics.median(firsts):.3f} s (max {max(firsts):.3f}); "
                  f"{sum(s > 0.005 for s in stalls)}/{len(stalls)} streams stalled, {sum(stalls):.3f} s in all")
        ratio = statistics.median(results[True][0]) / statistics.median(results[False][0])
        print(f"staggered_over_together_first_chunk: {ratio:.3f}")
    finally:
        tts.close()


if __name__ == "__main__":
    main()
