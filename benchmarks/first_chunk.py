"""First-chunk latency and real-time factor, streaming vs non-streaming, on the mid-size random model.

Run: ``python benchmarks/first_chunk.py [--seconds 10] [--repeats 3] [--first-audio-pause contended]``. Prints a
table, then the headline ``first_chunk_s: X`` (median streaming first-chunk latency) last. The non-streaming
time-to-audio measured in the same run is the baseline: ``first_chunk_over_nonstream`` is their ratio.

``playback stall`` is what a listener would hear: a player that starts at the first chunk and plays every chunk
as it comes waits this long in all, between chunks, for audio that has not arrived (median over the repeats).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from midsize import fixed_length_request, midsize_engine

from cadenza.engine.scheduler_config import FIRST_AUDIO_PAUSES


def playback_stall(arrivals: list[tuple[float, float]]) -> float:
    """Seconds a player that starts at the first chunk waits for later ones: ``arrivals`` = (arrival time, audio
    seconds) per chunk."""
    clock, stall = arrivals[0][0], 0.0
    for arrived, seconds in arrivals:
        if arrived > clock:
            stall, clock = stall + arrived - clock, arrived
        clock += seconds
    return stall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--first-audio-pause", default="always", choices=FIRST_AUDIO_PAUSES)
    parser.add_argument("--no-flow-ahead", action="store_true", help="SchedulerConfig(flow_ahead=False)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = midsize_engine(first_audio_pause=args.first_audio_pause, flow_ahead=not args.no_flow_ahead)
    try:
        engine.synthesize(fixed_length_request(engine, 2.0, seed=99))  # warm-up
        first, stream_total, nonstream_total, stalls = [], [], [], []
        rate = engine.config.sample_rate
        for r in range(args.repeats):
            t0 = time.perf_counter()
            arrivals = [(time.perf_counter() - t0, len(chunk) / rate)
                        for chunk in engine.stream(fixed_length_request(engine, args.seconds, seed=r))]
            first.append(arrivals[0][0])
            stalls.append(playback_stall(arrivals))
            stream_total.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            audio = engine.synthesize(fixed_length_request(engine, args.seconds, seed=r))
            nonstream_total.append(time.perf_counter() - t0)
        duration = len(audio) / engine.config.sample_rate
        fc, st, ns = statistics.median(first), statistics.median(stream_total), statistics.median(nonstream_total)
        print(f"utterance: {duration:.1f} s audio, {args.threads} threads, median of {args.repeats}, "
              f"first_audio_pause={args.first_audio_pause}, flow_ahead={not args.no_flow_ahead}")
        print(f"{'path':<14}{'first audio (s)':>16}{'total (s)':>11}{'RTF':>7}{'playback stall (s)':>20}")
        print(f"{'streaming':<14}{fc:>16.3f}{st:>11.3f}{st / duration:>7.3f}{statistics.median(stalls):>20.3f}")
        print(f"{'non-streaming':<14}{ns:>16.3f}{ns:>11.3f}{ns / duration:>7.3f}{'':>20}")
        print(f"first_chunk_over_nonstream: {fc / ns:.3f}")
        print(f"first_chunk_s: {fc:.3f}")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
