"""VoxCPM 2 multi-LoRA serving: audio seconds per wall second of 8 concurrent streams whose requests use two LoRA
adapters and none, applied per batch row (``models/voxcpm2/lora_bank.py``), against the same 8 streams without
adapters (the base model: also what one adapter merged into the weights costs), in one run.

Model and requests: those of ``voxcpm2_throughput.py`` (the mid-size random configuration, ~250 M parameters; 8
streaming requests of ``--patches`` patches each, the stop head ignored). Adapters: two random adapters of the
release recipe (rank 32, alpha 32 on the q/k/v/o projections of both LMs and the LocDiT). Levels, run in turn
``--rounds`` times; each level's best round is compared (on a shared machine a slow spell can halve a round's rate,
and it lands on one level at a time), the medians are printed beside them:

* ``base``: no request has an adapter;
* ``mixed``: 3 requests with adapter a, 3 with b, 2 without, batched together;
* ``one adapter``: all 8 with adapter a (per row).

Then, less exposed to a shared machine's noise, the batched step alone (``batched.step_runs`` + ``advance_runs``, the
DiT sampling and LM step of all 8 requests) on one thread, ``--step-repeats`` times per level in turn, the fastest
kept. Prints the CPU, the tables, and ``voxcpm2_multi_lora_step_mixed_over_base: X`` last (time ratio: 1.0 = free).

    python benchmarks/voxcpm2_multi_lora.py [--patches 8] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from voxcpm2_throughput import CONCURRENT, build_engine, concurrently, consume, make_requests

from cadenza.engine.precision import detect_cpu
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.models.voxcpm2.batched import PatchRun, advance_runs, step_runs
from cadenza.models.voxcpm2.generate import GenerationOptions
from cadenza.models.voxcpm2.lora import LoRAConfig, _targets

RELEASE_LORA = LoRAConfig(enable_lm=True, enable_dit=True, r=32, alpha=32.0)
LEVELS = {"base": [None] * 8, "mixed": ["a", "a", "a", "b", "b", "b", None, None], "one adapter": ["a"] * 8}


def random_adapter(model, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name in _targets(model, RELEASE_LORA):
        layer = model.get_submodule(name)
        state[f"{name}.lora_A"] = torch.randn(RELEASE_LORA.r, layer.in_features, generator=gen) * 0.02
        state[f"{name}.lora_B"] = torch.randn(layer.out_features, RELEASE_LORA.r, generator=gen) * 0.02
    return state


def run_level(engine, names: list[str | None], patches: int) -> float:
    """Wall seconds for the 8 requests, all in flight at once."""
    requests = make_requests(engine, patches)
    for request, name in zip(requests, names):
        request.lora = None if name is None else engine.loras.get(name)
    return concurrently(engine, requests)[0]


def time_steps(engine, repeats: int) -> dict[str, float]:
    """Fastest seconds of one batched step (DiT sampling + LM step) of the 8 requests, per level, one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = engine.model
    options = GenerationOptions(min_len=999, max_len=999)
    runs = {}
    with torch.inference_mode():
        for level, names in LEVELS.items():
            requests = make_requests(engine, 4)
            runs[level] = [PatchRun(model, r.layout, options, torch.Generator().manual_seed(r.seed),
                                    None if n is None else engine.loras.get(n)) for r, n in zip(requests, names)]
        best = {level: float("inf") for level in LEVELS}
        for _ in range(repeats):
            for level, level_runs in runs.items():
                noise = [r.noise() for r in level_runs]
                start = time.perf_counter()
                steps = step_runs(model, level_runs, noise)
                advance_runs(model, level_runs, [s.patch for s in steps])
                best[level] = min(best[level], time.perf_counter() - start)
        for level_runs in runs.values():
            for run in level_runs:
                run.close()
    torch.set_num_threads(threads)
    return best


def streams(engine, args: argparse.Namespace) -> None:
    """The 8 concurrent streams per level, ``args.rounds`` times in turn: a table and the best-round ratios."""
    consume(engine, make_requests(engine, 2)[0])  # warm-up (starts the workers)
    audio_s = CONCURRENT * args.patches * engine.config.patch_size * engine.vae.decode_hop_length / engine.sample_rate
    rates: dict[str, list[float]] = {level: [] for level in LEVELS}
    for _ in range(args.rounds):
        for level, names in LEVELS.items():
            rates[level].append(audio_s / run_level(engine, names, args.patches))
    print(f"{'level':<12} {'audio s':>8} {'audio s / wall s (per round)':>32} {'median':>7} {'best':>6}")
    for level, values in rates.items():
        per_round = " ".join(f"{v:.2f}" for v in values)
        print(f"{level:<12} {audio_s:>8.2f} {per_round:>32} {statistics.median(values):>7.2f} {max(values):>6.2f}")
    base = max(rates["base"])
    print(f"voxcpm2_multi_lora_one_adapter_over_base: {max(rates['one adapter']) / base:.2f}")
    print(f"voxcpm2_multi_lora_mixed_over_base: {max(rates['mixed']) / base:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patches", type=int, default=8, help="patches per request (0.16 s of audio each)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all levels; the best is compared (0: skip)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the machine's cores)")
    parser.add_argument("--step-repeats", type=int, default=8, help="timed batched steps per level")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = build_engine(SchedulerConfig(max_active=CONCURRENT, max_queued=CONCURRENT))
    for i, name in enumerate(("a", "b")):
        adapter = engine.register_lora_tensors(name, RELEASE_LORA, random_adapter(engine.model, i))
    n_params = sum(p.numel() for p in engine.model.parameters())
    print(f"CPU: {detect_cpu().describe()} ({torch.get_num_threads()} torch threads)")
    print(f"VoxCPM 2 mid-size random model: {n_params / 1e6:.1f} M parameters; adapters of {adapter.n_parameters / 1e6:.1f}"
          f" M parameters each; {CONCURRENT} streaming requests of {args.patches} patches")
    if args.rounds:
        streams(engine, args)
    steps = time_steps(engine, args.step_repeats)
    print("one batched step of the 8 requests (DiT sampling + LM step), one thread, fastest of "
          f"{args.step_repeats}: " + ", ".join(f"{level} {t * 1e3:.0f} ms" for level, t in steps.items()))
    print(f"voxcpm2_multi_lora_step_one_adapter_over_base: {steps['one adapter'] / steps['base']:.3f}")
    print(f"voxcpm2_multi_lora_step_mixed_over_base: {steps['mixed'] / steps['base']:.3f}")
    engine.close()


if __name__ == "__main__":
    main()
