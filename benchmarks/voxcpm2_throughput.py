"""VoxCPM 2 throughput with continuous batching: audio seconds generated per wall second with 8 concurrent streaming
requests against the same 8 requests run one at a time, both through the engine's scheduler, in one run.

Model: the mid-size random configuration of ``voxcpm2_cpu.py`` (~250 M parameters: LM 1024 x 12, RALM x 4,
LocEnc / LocDiT 512 x 6, the release's patch size, latent width and head dim; AudioVAE decoder 256 wide). Requests:
8 random texts of 24-59 tokens, fixed seeds, exactly ``--patches`` patches each (``min_len = max_len``: the stop
head is ignored, so no runaway or early stop skews a level), streamed and decoded chunk by chunk. The two levels run
in turn, ``--rounds`` times over, and each figure is the median over the rounds (a slow spell of a shared machine
then lands on both). The batched audio is checked against the one-at-a-time audio (float rounding apart, the same).

``--profile`` also times the batched step functions alone (``models/voxcpm2/batched.py``) at 1 and 4 requests on
one thread: where a step's time goes. ``--workers`` / ``--worker-threads`` set ``SchedulerConfig.vocoder_workers`` /
``vocoder_threads`` (the scheduler's worker layout; default: its own choice). Prints the CPU model, a table, and
``voxcpm2_throughput_8_over_1: X`` last.

    python benchmarks/voxcpm2_throughput.py [--patches 12] [--rounds 3] [--threads 2] [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np
import torch
from voxcpm2_cpu import MIDSIZE

from cadenza.engine.precision import detect_cpu
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.batched import PatchRun, advance_runs, step_runs
from cadenza.models.voxcpm2.config import VoxCPM2Config
from cadenza.models.voxcpm2.generate import GenerationOptions
from cadenza.models.voxcpm2.layouts import build_layout
from cadenza.models.voxcpm2.model import VoxCPM2Model
from cadenza.models.voxcpm2.request import VoxCPM2Request
from cadenza.models.voxcpm2.request_text import RequestText
from cadenza.models.voxcpm2.retry import RetryPolicy
from cadenza.models.voxcpm2.streaming import PatchDecoder

CONCURRENT = 8


def build_engine(config: SchedulerConfig) -> VoxCPM2Engine:
    torch.manual_seed(0)  # random weights (this script only; the library never seeds the global RNG)
    model_config = VoxCPM2Config.from_dict(MIDSIZE, source="benchmark config")
    model = VoxCPM2Model(model_config).eval()
    vae = AudioVAE(AudioVAEConfig.from_dict(MIDSIZE["audio_vae_config"])).eval()
    return VoxCPM2Engine(model, vae, tokenizer=None, scheduler=config)  # requests are built from ids below


def make_requests(engine: VoxCPM2Engine, patches: int) -> list[VoxCPM2Request]:
    config = engine.config
    gen = torch.Generator().manual_seed(1)
    requests = []
    for i in range(CONCURRENT):
        n = 24 + 5 * i  # varied prompt lengths: the KV caches of one batch differ in length
        ids = torch.randint(5, config.lm_config.vocab_size, (n,), generator=gen).tolist()
        layout = build_layout(ids, config.patch_size, config.feat_dim, special=config.special_tokens)
        text = RequestText(text=f"benchmark text {i}", description=None, spoken=f"benchmark text {i}")
        requests.append(VoxCPM2Request(text=text, voice=None, layout=layout, target_len=n,
                                       options=GenerationOptions(min_len=patches, max_len=patches),
                                       retry=RetryPolicy(enabled=False), seed=100 + i))
    return requests


def consume(engine: VoxCPM2Engine, request: VoxCPM2Request) -> np.ndarray:
    return np.concatenate(list(engine.stream(request)))


def one_at_a_time(engine: VoxCPM2Engine, requests: list[VoxCPM2Request]) -> tuple[float, list[np.ndarray]]:
    start = time.perf_counter()
    out = [consume(engine, r) for r in requests]
    return time.perf_counter() - start, out


def concurrently(engine: VoxCPM2Engine, requests: list[VoxCPM2Request]) -> tuple[float, list[np.ndarray]]:
    out: list[np.ndarray | None] = [None] * len(requests)

    def run(i: int) -> None:
        out[i] = consume(engine, requests[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, out


def profile_steps(engine: VoxCPM2Engine, requests: list[VoxCPM2Request]) -> None:
    """Median ms of each batched phase at 1 and 4 requests, one thread (the scheduler's per-worker setting)."""
    model, vae = engine.model, engine.vae
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print("phase times, one thread (ms per step for the batch / per request):")
    with torch.inference_mode():
        for b in (1, 4):
            picked = requests[:b]
            t0 = time.perf_counter()
            runs = [PatchRun(model, r.layout, GenerationOptions(min_len=99, max_len=99),
                             torch.Generator().manual_seed(r.seed)) for r in picked]
            prefill = (time.perf_counter() - t0) / b
            decoders = [PatchDecoder(vae) for _ in picked]
            marks: dict[str, list[float]] = {"DiT + stop head": [], "LocEnc + LM step": [], "AudioVAE decode": []}
            for _ in range(4):
                noise = [r.noise() for r in runs]
                t0 = time.perf_counter()
                steps = step_runs(model, runs, noise)
                t1 = time.perf_counter()
                advance_runs(model, runs, [s.patch for s in steps])
                t2 = time.perf_counter()
                PatchDecoder.decode_many(decoders, [s.patch for s in steps])
                t3 = time.perf_counter()
                for key, dt in zip(marks, (t1 - t0, t2 - t1, t3 - t2)):
                    marks[key].append(dt)
            cells = "  ".join(f"{k} {statistics.median(v) * 1e3:.0f} / {statistics.median(v) * 1e3 / b:.0f}"
                              for k, v in marks.items())
            print(f"  {b} request(s): prefill {prefill * 1e3:.0f} per request;  {cells}")
            for run in runs:
                run.close()
    torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patches", type=int, default=12, help="patches per request (0.16 s of audio each)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both levels; medians are reported")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the machine's cores)")
    parser.add_argument("--workers", type=int, default=None, help="SchedulerConfig.vocoder_workers")
    parser.add_argument("--worker-threads", type=int, default=None, help="SchedulerConfig.vocoder_threads")
    parser.add_argument("--profile", action="store_true", help="also time the batched phases alone")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = SchedulerConfig(max_active=CONCURRENT, max_queued=CONCURRENT, vocoder_workers=args.workers,
                             vocoder_threads=args.worker_threads)
    engine = build_engine(config)
    requests = make_requests(engine, args.patches)
    n_params = sum(p.numel() for p in engine.model.parameters())
    print(f"CPU: {detect_cpu().describe()} ({torch.get_num_threads()} torch threads)")
    print(f"VoxCPM 2 mid-size random model: {n_params / 1e6:.1f} M parameters; {CONCURRENT} streaming requests of "
          f"{args.patches} patches each, 10 Euler steps, cfg 2")
    if args.profile:
        profile_steps(engine, requests)
    consume(engine, make_requests(engine, 2)[0])  # warm-up (starts the workers)
    samples = sum(args.patches * engine.config.patch_size * engine.vae.decode_hop_length for _ in requests)
    audio_s = samples / engine.sample_rate
    rates: dict[str, list[float]] = {"1 at a time": [], f"{CONCURRENT} concurrent": []}
    worst = 0.0
    for _ in range(args.rounds):
        seq_s, seq_out = one_at_a_time(engine, requests)
        con_s, con_out = concurrently(engine, requests)
        rates["1 at a time"].append(audio_s / seq_s)
        rates[f"{CONCURRENT} concurrent"].append(audio_s / con_s)
        worst = max(worst, max(float(np.abs(a - b).max()) for a, b in zip(seq_out, con_out)))
    workers, threads = engine.scheduler._workers, engine.scheduler._worker_threads
    engine.close()
    print(f"scheduler: {workers} worker(s), {threads} intra-op thread(s) each ({engine.scheduler._cores} for a lone "
          f"request); largest batch {engine.scheduler.max_batch}")
    print(f"{'level':<14} {'audio s':>8} {'audio s / wall s (per round)':>32} {'median':>7}")
    for label, values in rates.items():
        per_round = " ".join(f"{v:.2f}" for v in values)
        print(f"{label:<14} {audio_s:>8.2f} {per_round:>32} {statistics.median(values):>7.2f}")
    print(f"max |batched - one at a time| over all samples: {worst:.2g} (float rounding of batched products)")
    ratio = statistics.median(rates[f"{CONCURRENT} concurrent"]) / statistics.median(rates["1 at a time"])
    print(f"voxcpm2_throughput_8_over_1: {ratio:.2f}")


if __name__ == "__main__":
    main()
