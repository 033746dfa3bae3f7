"""First-chunk latency and real-time factor, streaming vs non-streaming, on the mid-size random model.

Run: ``python benchmarks/first_chunk.py [--seconds 10] [--repeats 3]``. Prints a table, then the headline
``first_chunk_s: X`` (median streaming first-chunk latency) last. The non-streaming time-to-audio measured in the
same run is the baseline: ``first_chunk_over_nonstream`` is their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from midsize import fixed_length_request, midsize_engine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = midsize_engine()
    try:
        engine.synthesize(fixed_length_request(engine, 2.0, seed=99))  # warm-up
        first, stream_total, nonstream_total = [], [], []
        for r in range(args.repeats):
            t0 = time.perf_counter()
            samples = 0
            for i, chunk in enumerate(engine.stream(fixed_length_request(engine, args.seconds, seed=r))):
                if i == 0:
                    first.append(time.perf_counter() - t0)
                samples += len(chunk)
            stream_total.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            audio = engine.synthesize(fixed_length_request(engine, args.seconds, seed=r))
            nonstream_total.append(time.perf_counter() - t0)
        duration = len(audio) / engine.config.sample_rate
        fc, st, ns = statistics.median(first), statistics.median(stream_total), statistics.median(nonstream_total)
        print(f"utterance: {duration:.1f} s audio, {args.threads} threads, median of {args.repeats}")
        print(f"{'path':<14}{'first audio (s)':>16}{'total (s)':>11}{'RTF':>7}")
        print(f"{'streaming':<14}{fc:>16.3f}{st:>11.3f}{st / duration:>7.3f}")
        print(f"{'non-streaming':<14}{ns:>16.3f}{ns:>11.3f}{ns / duration:>7.3f}")
        print(f"first_chunk_over_nonstream: {fc / ns:.3f}")
        print(f"first_chunk_s: {fc:.3f}")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
