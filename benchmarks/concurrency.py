"""Aggregate throughput (audio seconds produced per wall-clock second) at 1, 2, 4, 8 concurrent requests.

Run: ``python benchmarks/concurrency.py [--seconds 6]``. Each level submits that many streaming requests at once to
the scheduler of the mid-size random model and waits for all of them; the single-request throughput measured in
the same run is the baseline. Prints a table, then ``throughput_8_over_1: X`` last.
"""

from __future__ import annotations

import argparse
import threading
import time

import torch
from midsize import fixed_length_request, midsize_engine


def run_level(engine, n: int, seconds: float) -> tuple[float, float]:
    """Returns (audio seconds per second, mean first-chunk latency)."""
    requests = [fixed_length_request(engine, seconds, seed=100 + i) for i in range(n)]
    produced = [0] * n
    first = [0.0] * n
    start = time.perf_counter()

    def consume(i: int) -> None:
        for k, chunk in enumerate(engine.stream(requests[i])):
            if k == 0:
                first[i] = time.perf_counter() - start
            produced[i] += len(chunk)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return sum(produced) / engine.config.sample_rate / elapsed, sum(first) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = midsize_engine(max_active=8)
    try:
        run_level(engine, 1, 1.0)  # warm-up
        results = {n: run_level(engine, n, args.seconds) for n in (1, 2, 4, 8)}
        print(f"{args.seconds:.0f} s utterances, {args.threads} threads")
        print(f"{'concurrent':>10}{'audio s / s':>13}{'x single':>10}{'mean first chunk (s)':>22}")
        for n, (tput, fc) in results.items():
            print(f"{n:>10}{tput:>13.2f}{tput / results[1][0]:>10.2f}{fc:>22.3f}")
        print(f"throughput_8_over_1: {results[8][0] / results[1][0]:.2f}")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
