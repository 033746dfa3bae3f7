"""cadenza-tiny on this CPU: streaming first-chunk latency and real-time factor, through the public API.

Run: ``python benchmarks/tiny_streaming.py [--repeats 5] [--threads 1] [--model DIR]`` (default: the built-in model;
one torch thread: with two, intra-op overhead makes this small model slower on a 2-core CPU).
Each repeat speaks a different ~3 s sentence with the default voice (a saved speaker); streaming
first-chunk latency (call -> first chunk), total time and RTF (compute / audio seconds). The non-streaming
synthesis of the same sentences in the same run is the baseline (``first_chunk_over_nonstream``). The headline
lines come last: ``tiny_rtf: X`` then ``tiny_first_chunk_s: X`` (medians; goals < 0.5 each).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import cadenza

SENTENCES = (
    "The people gathered in the evening to hear the news from the city.",
    "He went out into the field and looked at the sky for a long time.",
    "Every morning she opened the window and listened to the birds.",
    "They walked together along the river until the sun went down.",
    "The old house at the end of the road was quiet and dark.",
    "We will meet again tomorrow at the gate of the garden.",
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for this small model)")
    p.add_argument("--model", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    tts = cadenza.load(a.model)
    try:
        tts.synthesize("Warm up.", seed=0)
        first, rtf, nonstream = [], [], []
        for r in range(a.repeats):
            text = SENTENCES[r % len(SENTENCES)]
            t0 = time.perf_counter()
            n = 0
            for i, chunk in enumerate(tts.synthesize_stream(text, seed=r)):
                if i == 0:
                    first.append(time.perf_counter() - t0)
                n += len(chunk)
            total = time.perf_counter() - t0
            rtf.append(total / (n / tts.sample_rate))
            t0 = time.perf_counter()
            tts.synthesize(text, seed=r)
            nonstream.append(time.perf_counter() - t0)
            print(f"repeat {r}: {n / tts.sample_rate:.2f} s audio, first chunk {first[-1]:.3f} s, RTF {rtf[-1]:.3f}, "
                  f"non-streaming {nonstream[-1]:.3f} s")
        fc, ns = statistics.median(first), statistics.median(nonstream)
        print(f"threads: {a.threads}, median of {a.repeats}")
        print(f"first_chunk_over_nonstream: {fc / ns:.3f}")
        print(f"tiny_rtf: {statistics.median(rtf):.3f}")
        print(f"tiny_first_chunk_s: {fc:.3f}")
    finally:
        tts.close()


if __name__ == "__main__":
    main()
