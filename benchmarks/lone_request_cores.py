"""CosyVoice 2, one request alone on a multi-core CPU: every core for it (``engine/wide_lane.py``) against the fixed
split the scheduler uses for many streams (the LM worker half the cores, each vocoder worker its share), in one run.

Model: the mid-size random CosyVoice 2 of ``benchmarks/midsize.py`` (``--size full``: the release's sizes; ``--size
builtin``: the built-in cadenza-tiny, smaller than mid-size, where a second intra-op thread gains least). The two
engines share the weights and differ only in ``SchedulerConfig``: ``split`` sets ``lm_threads`` / ``vocoder_threads``
by hand (what a lone request got before), ``lone`` leaves them to the scheduler. Alternating, best of ``--rounds``:

* end to end: ``synthesize`` of a request that makes exactly ``--seconds`` of audio (non-streaming);
* streaming: first chunk and total of a ``--stream-seconds`` request.

The last lines are ``lone_over_split_<part>: X`` (below 1: faster with every core).

    python benchmarks/lone_request_cores.py [--threads 2] [--seconds 5] [--stream-seconds 10] [--rounds 3]
        [--size mid|full] [--dtype auto] [--lm-int8]
"""

from __future__ import annotations

import argparse
import time

import torch
from midsize import fixed_length_request, midsize_config, random_model

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.precision import Precision, apply_precision, detect_cpu
from cadenza.engine.scheduler import SchedulerConfig
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.speakers import SpeakerStore


def timed_stream(engine: CosyVoice2Engine, seconds: float, seed: int) -> tuple[float, float]:
    """(first chunk, total) seconds of one streamed request."""
    start = time.perf_counter()
    first = None
    for chunk in engine.stream(fixed_length_request(engine, seconds, seed)):
        if first is None and len(chunk):
            first = time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (cores the engine may use)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of speech, non-streaming")
    parser.add_argument("--stream-seconds", type=float, default=10.0, help="seconds of speech, streaming")
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per engine, alternating; the best is kept")
    parser.add_argument("--size", choices=("mid", "full", "builtin"), default="mid",
                        help="mid-size or release-size random weights, or the built-in model")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"))
    parser.add_argument("--lm-int8", action="store_true", help="the LM in int8")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cores = torch.get_num_threads()
    if cores < 2:
        raise SystemExit("one thread: there is nothing to split (use --threads 2 or more)")
    precision = Precision.choose(args.dtype, "cpu", lm_int8=args.lm_int8)
    print(f"CPU: {detect_cpu().describe()}, {cores} threads, torch {torch.__version__}; {precision.describe()}")

    if args.size == "builtin":
        import cadenza

        model = cadenza.load().engine.model  # its own engine stays idle
    else:
        model = random_model(midsize_config() if args.size == "mid" else CosyVoice2Config())
    model = apply_precision(model, precision)
    split = SchedulerConfig(lm_threads=max(1, cores // 2), vocoder_threads=max(1, cores // 2))
    engines = {name: CosyVoice2Engine(model, None, SpeakerStore(None), scheduler_config=config)  # the same weights
               for name, config in (("split", split), ("lone", SchedulerConfig()))}
    print(f"model: {args.size}; split = LM {split.lm_threads} thread(s), each of "
          f"{split.worker_layout(cores)[0]} vocoder workers {split.vocoder_threads}")

    best: dict[str, dict[str, float]] = {name: {} for name in engines}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for name, engine in engines.items():
            start = time.perf_counter()
            engine.synthesize(fixed_length_request(engine, args.seconds, seed=1))
            e2e = time.perf_counter() - start
            first, total = timed_stream(engine, args.stream_seconds, seed=2)
            if round_:
                for part, value in (("end_to_end", e2e), ("first_chunk", first), ("stream_total", total)):
                    best[name][part] = min(best[name].get(part, value), value)
                print(f"round {round_} {name}: end to end {e2e:.2f} s, stream first chunk {first:.2f} s, "
                      f"total {total:.2f} s")
    for part in ("end_to_end", "first_chunk", "stream_total"):
        print(f"{part}: split {best['split'][part]:.2f} s, lone {best['lone'][part]:.2f} s")
    for part in ("end_to_end", "first_chunk", "stream_total"):
        print(f"lone_over_split_{part}: {best['lone'][part] / best['split'][part]:.2f}")
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
