"""CosyVoice 2 serving figures on an accelerator (or any torch device): first chunk, RTF at 1 / 8 / 32 concurrent
streams, aggregate real-time streams and peak memory, release-size random weights.

Run on the machine to measure: ``python benchmarks/gpu.py [--device cuda] [--size full] [--levels 1,8,32]
[--seconds 10] [--dtype auto]``. The engine is the one the server runs (continuous batching of the LM over the
streams, flow + HiFT workers, the precision ``--dtype auto`` picks for the device: bf16 flow and HiFT on a bf16
GPU). Each level submits that many streaming requests at once and waits for all; per level: median first-chunk
latency, per-stream RTF (wall time / audio seconds of one stream; below 1: faster than real time), aggregate audio
seconds per second (= how many real-time streams the device sustains at that level), and peak device memory. The
baseline measured in the same run is one non-streaming request's time to audio; the last line is
``first_chunk_over_nonstream: X`` (below 1: streaming's first audio arrives that much sooner).

On CPU (``--device cpu --size mid --levels 1,2 --seconds 2``) it runs as a smoke test of the script itself; the
figures that matter are the accelerator's (docs/performance.md "GPU": unmeasured until a session has one).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
from midsize import fixed_length_request, midsize_config, random_model, stream_together

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.precision import Precision
from cadenza.engine.scheduler import SchedulerConfig
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.speakers import SpeakerStore


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB -> GiB (whole process)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_level(engine: CosyVoice2Engine, n: int, seconds: float) -> dict[str, float]:
    produced, first, elapsed = stream_together(engine, [fixed_length_request(engine, seconds, seed=100 + i)
                                                        for i in range(n)])
    rate = engine.config.sample_rate
    per_stream = statistics.median(p / rate for p in produced)
    return {"first_chunk_s": statistics.median(first), "rtf": elapsed / per_stream,
            "audio_s_per_s": sum(produced) / rate / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=("mid", "full"), default="full")
    parser.add_argument("--levels", default="1,8,32", help="concurrent streams per level")
    parser.add_argument("--seconds", type=float, default=10.0, help="audio per stream")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"))
    parser.add_argument("--threads", type=int, default=0, help="CPU torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    levels = [int(v) for v in args.levels.split(",")]
    precision = Precision.choose(args.dtype, device.type)

    config = midsize_config() if args.size == "mid" else CosyVoice2Config()
    model = random_model(config).to(device)
    engine = CosyVoice2Engine(model, None, SpeakerStore(None), precision=precision,
                              scheduler_config=SchedulerConfig(max_active=max(levels), max_queued=4 * max(levels)))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {device} ({name}), {args.size}-size random CosyVoice 2, precision {precision.describe()}, "
          f"{args.seconds:g} s per stream, torch {torch.__version__}")
    try:
        engine.synthesize(fixed_length_request(engine, 1.0, seed=1))  # warm-up
        synchronize(device)
        start = time.perf_counter()
        audio = engine.synthesize(fixed_length_request(engine, args.seconds, seed=2))
        synchronize(device)
        nonstream = time.perf_counter() - start
        print(f"non-streaming: {nonstream:.3f} s to audio for {len(audio) / config.sample_rate:.2f} s "
              f"(RTF {nonstream * config.sample_rate / len(audio):.3f})")
        print(f"{'streams':>8}{'first chunk (s)':>17}{'RTF per stream':>16}{'audio s / s':>13}{'peak mem (GiB)':>16}")
        rows = {}
        for n in levels:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            rows[n] = run_level(engine, n, args.seconds)
            r = rows[n]
            print(f"{n:>8}{r['first_chunk_s']:>17.3f}{r['rtf']:>16.3f}{r['audio_s_per_s']:>13.2f}"
                  f"{peak_memory_gib(device):>16.2f}", flush=True)
        best = max(rows.values(), key=lambda r: r["audio_s_per_s"])
        print(f"real-time streams sustained (aggregate audio s / s at the best level): {best['audio_s_per_s']:.1f}")
        print(f"first_chunk_over_nonstream: {rows[levels[0]]['first_chunk_s'] / nonstream:.3f}")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
