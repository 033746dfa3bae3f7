"""Aggregate throughput (audio seconds produced per wall-clock second) at 1, 2, 4, 8 concurrent requests.

Run: ``python benchmarks/concurrency.py [--seconds 6] [--rounds 3]``. Each level submits that many streaming
requests at once to the scheduler of the mid-size random model and waits for all of them; the single-request
throughput measured in the same run is the baseline. The levels run in turn, ``--rounds`` times over, and each
figure is the median over the rounds (a noisy machine's slow spell then lands on every level alike instead of on
one). Prints a table, then ``throughput_8_over_1: X`` (ratio of the medians) last.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from midsize import fixed_length_request, midsize_engine, stream_together

from cadenza.engine.scheduler_config import FIRST_AUDIO_PAUSES


def run_level(engine, n: int, seconds: float) -> tuple[float, float]:
    """Returns (audio seconds per second, mean first-chunk latency)."""
    produced, first, elapsed = stream_together(engine, [fixed_length_request(engine, seconds, seed=100 + i)
                                                        for i in range(n)])
    return sum(produced) / engine.config.sample_rate / elapsed, sum(first) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocoder-workers", type=int, default=None, help="default: the scheduler's choice")
    parser.add_argument("--first-audio-pause", default=None, choices=FIRST_AUDIO_PAUSES,
                        help="SchedulerConfig.first_audio_pause (default: the scheduler's)")
    parser.add_argument("--no-flow-ahead", action="store_true", help="SchedulerConfig(flow_ahead=False)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layout: dict = {"flow_ahead": not args.no_flow_ahead}
    if args.vocoder_workers is not None:
        layout["vocoder_workers"] = args.vocoder_workers
    if args.first_audio_pause is not None:
        layout["first_audio_pause"] = args.first_audio_pause
    engine = midsize_engine(max_active=8, **layout)
    levels = (1, 2, 4, 8)
    try:
        run_level(engine, 1, 1.0)  # warm-up
        runs: dict[int, list[tuple[float, float]]] = {n: [] for n in levels}
        for _ in range(args.rounds):
            for n in levels:
                runs[n].append(run_level(engine, n, args.seconds))
        tput = {n: statistics.median(t for t, _ in runs[n]) for n in levels}
        first = {n: statistics.median(f for _, f in runs[n]) for n in levels}
        workers = getattr(engine.scheduler, "_vocoder_workers", 1)
        pause = engine.scheduler.config.first_audio_pause
        print(f"{args.seconds:.0f} s utterances, {args.threads} threads, {workers} vocoder worker(s), "
              f"first_audio_pause={pause}, flow_ahead={engine.scheduler.config.flow_ahead}, "
              f"median of {args.rounds} rounds")
        print(f"{'concurrent':>10}{'audio s / s':>13}{'x single':>10}{'mean first chunk (s)':>22}  rounds (audio s / s)")
        for n in levels:
            each = " ".join(f"{t:.2f}" for t, _ in runs[n])
            print(f"{n:>10}{tput[n]:>13.2f}{tput[n] / tput[1]:>10.2f}{first[n]:>22.3f}  {each}")
        print(f"throughput_8_over_1: {tput[8] / tput[1]:.2f}")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
