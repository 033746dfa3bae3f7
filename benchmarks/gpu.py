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
from midsize import TOKENS_PER_SECOND, fixed_length_request, midsize_config, random_model, stream_together

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.lm_decode import DecodeStep
from cadenza.engine.precision import Precision
from cadenza.engine.scheduler import SchedulerConfig
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.speakers import SpeakerStore


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB -> GiB (whole process)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


LM_STEPS = {"auto": {}, "per-row": {"lm_kv_pool": False}, "pool": {"lm_kv_pool": True, "lm_cuda_graphs": False},
            "graphs": {"lm_kv_pool": True, "lm_cuda_graphs": True}}


def timed(device: torch.device, fn, repeats: int = 5) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after one warm-up (device work waited for)."""
    fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_decode(step: DecodeStep, lm, device: torch.device, batch: int, hidden: int) -> float:
    """Seconds of one decode step of ``batch`` requests, each with a 200-position cache (median of 20)."""
    gen = torch.Generator().manual_seed(0)
    caches = []
    for _ in range(batch):
        cache = step.new_cache() or lm.new_cache()
        lm.forward_hidden(torch.randn(1, 200, hidden, generator=gen).to(device), cache=cache)
        caches.append(cache)
    embeds = torch.randn(batch, 1, hidden, generator=gen).to(device)

    def decode() -> None:
        step(embeds, caches)
        for c in caches:  # back to 200 positions: every timed step sees the same length
            c.crop(200)

    try:
        return timed(device, decode, 20)
    finally:
        for c in caches:
            c.free()


@torch.inference_mode()
def stage_times(engine: CosyVoice2Engine, device: torch.device, seconds: float, batches: list[int]) -> None:
    """Where a stream's time goes, stage by stage: the LM's batched decode step (ms per step at each batch size,
    every request with a 200-position cache; per-request caches attended row by row, against the engine's own step:
    pooled and graph-captured on CUDA), the flow and HiFT over ``seconds`` of speech (non-streaming)."""
    model, cfg = engine.model, engine.config
    lm, hidden = model.lm, cfg.lm.llm_input_size
    engine_step = engine.scheduler.decode_step
    mode = ("KV pool + CUDA graphs" if engine_step.cuda_graphs else "KV pool" if engine_step.pool is not None
            else "per-request caches")
    for b in batches:
        per_row = time_decode(DecodeStep(lm), lm, device, b, hidden)
        ours = time_decode(engine_step, lm, device, b, hidden)
        print(f"LM decode step, batch {b:>3}: per-row {1000 * per_row:8.2f} ms, engine ({mode}) {1000 * ours:8.2f} ms"
              f" (x{per_row / ours:.1f})", flush=True)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.flow.vocab_size, (1, int(seconds * TOKENS_PER_SECOND)), generator=gen)
    prompt = engine.empty_voice()
    flow = model.flow

    def run_flow() -> torch.Tensor:
        return flow.inference(tokens, prompt.flow_prompt_speech, prompt.prompt_mel, prompt.embedding)

    mel = run_flow()
    t_flow = timed(device, run_flow)
    t_hift = timed(device, lambda: model.hift.inference(mel, generator=torch.Generator().manual_seed(1)))
    print(f"flow, {seconds:g} s of speech (10 Euler steps, CFG): {1000 * t_flow:8.1f} ms; "
          f"HiFT: {1000 * t_hift:8.1f} ms", flush=True)


def timeline(engine: CosyVoice2Engine, device: torch.device, n: int, seconds: float) -> None:
    """Where ``n`` concurrent streams' time goes: calls and wall seconds of each engine stage (the LM worker's step,
    each kind of vocoder-worker work), each call waited for on the device, and when each first ended, against the
    median first chunk. The waits add a little time; the point is the split."""
    from cadenza.engine import vocoder_workers
    from cadenza.engine.lm_worker import LMWorker
    from cadenza.engine.token2wav import StreamSynthesis
    from cadenza.engine.vocoder_workers import VocoderWorker

    spans: dict[str, list[tuple[float, float]]] = {}
    originals = []

    def wrap(cls, name: str, label: str) -> None:  # a class's method or a module's function
        original = getattr(cls, name)
        originals.append((cls, name, original))

        def timed_call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                synchronize(device)
                spans.setdefault(label, []).append((start, time.perf_counter()))

        setattr(cls, name, timed_call)

    wrap(LMWorker, "step", "LM step (prefills + one batched decode)")
    wrap(VocoderWorker, "_prime", "flow priming of a voice")
    wrap(VocoderWorker, "_flow_ahead", "flow ahead of a chunk")
    wrap(VocoderWorker, "_vocoder_batch", "chunks of several streams (flow + HiFT)")
    wrap(VocoderWorker, "_vocoder_step", "chunk of one stream (flow + HiFT)")
    wrap(StreamSynthesis, "flow_mel", "  of which the flow")
    wrap(StreamSynthesis, "vocode", "  of which HiFT")
    wrap(vocoder_workers, "flow_mels", "  of which the batched flow")
    wrap(vocoder_workers, "vocode_many", "  of which the batched HiFT")
    try:
        start = time.perf_counter()
        produced, first, elapsed = stream_together(
            engine, [fixed_length_request(engine, seconds, seed=300 + i) for i in range(n)])
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)
    print(f"timeline, {n} stream(s) of {seconds:g} s: first chunk {statistics.median(first):.3f} s, all done "
          f"{elapsed:.3f} s")
    for label, calls in spans.items():
        busy = sum(b - a for a, b in calls)
        print(f"  {label:<42} {len(calls):>5} calls {busy:8.3f} s busy, mean {1000 * busy / len(calls):7.1f} ms, "
              f"first ends at {min(b for _, b in calls) - start:.3f} s", flush=True)


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
    parser.add_argument("--lm-step", choices=tuple(LM_STEPS), default="auto",
                        help="the LM's batched decode step: auto (KV pool + CUDA graphs on CUDA, per-request caches "
                             "elsewhere), per-row, pool (eager), graphs")
    parser.add_argument("--first-hop", type=int, default=None,
                        help="speech tokens in a stream's first chunk (StreamSchedule.first_hop_len; default 25)")
    parser.add_argument("--timeline", default="", help="stream counts whose per-stage split is printed (e.g. 1,8)")
    parser.add_argument("--stages", default="1,8,32,64",
                        help="LM decode batch sizes timed stage by stage before the levels ('' = skip the stages)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    levels = [int(v) for v in args.levels.split(",")]
    stages = [int(v) for v in args.stages.split(",")] if args.stages else []
    timelines = [int(v) for v in args.timeline.split(",")] if args.timeline else []
    precision = Precision.choose(args.dtype, device.type)

    config = midsize_config() if args.size == "mid" else CosyVoice2Config()
    model = random_model(config).to(device)
    engine = CosyVoice2Engine(model, None, SpeakerStore(None), precision=precision,
                              schedule=StreamSchedule(first_hop_len=args.first_hop),
                              scheduler_config=SchedulerConfig(max_active=max(levels + stages + timelines),
                                                               max_queued=4 * max(levels), **LM_STEPS[args.lm_step]))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {device} ({name}), {args.size}-size random CosyVoice 2, precision {precision.describe()}, "
          f"{args.seconds:g} s per stream, torch {torch.__version__}")
    try:
        engine.synthesize(fixed_length_request(engine, 1.0, seed=1))  # warm-up
        synchronize(device)
        if args.stages:
            stage_times(engine, device, args.seconds, stages)
        start = time.perf_counter()
        audio = engine.synthesize(fixed_length_request(engine, args.seconds, seed=2))
        synchronize(device)
        nonstream = time.perf_counter() - start
        print(f"non-streaming: {nonstream:.3f} s to audio for {len(audio) / config.sample_rate:.2f} s "
              f"(RTF {nonstream * config.sample_rate / len(audio):.3f})")
        for n in timelines:
            timeline(engine, device, n, args.seconds)
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
