"""One VoxCPM 2 LoRA training step on CPU at the release's size (random weights): seconds per step and peak memory,
beside the same step at the fixture's size, in one run.

The step is the trainer's (``training/voxcpm2/stage.py``): the release recipe's adapters (rank 32, alpha 32 on the
q/k/v/o projections of both LMs and the LocDiT), float32 weights, ``voxcpm2_losses`` forward and backward, gradient
clipping and an AdamW step over the adapters, on a packed micro-batch of ``--clips`` clips of ``--seconds`` of
(random) audio latents and ``--text-tokens`` text tokens each. The weights are random (the release is not
downloadable here); the arithmetic and memory of a step do not depend on their values. Each size runs ``--steps``
steps after ``--warmup`` warm-up steps, in float32 and under bf16 autocast (what ``mixed_precision: auto`` picks on
CPUs with AMX / AVX512-BF16); the median is reported. Peak memory is the process's peak resident set (``VmHWM``), in
a fresh subprocess per size, reset after building the model (``/proc/self/clear_refs``) so that each precision's
peak is its own: ``build_peak_gib`` (the model and its adapters), ``float32_peak_gib``, ``bf16_autocast_peak_gib``.

    python benchmarks/voxcpm2_train_step.py [--size both|fixture|release] [--steps 2] [--warmup 1] [--clips 2]
                                            [--seconds 5] [--threads 1] [--precision both|float32|bf16_autocast]
                                            [--activation-checkpointing off|on|both]

``--activation-checkpointing both`` runs each size twice (fresh subprocesses), without and with the trainer's
``voxcpm2.activation_checkpointing`` (every layer of the four MiniCPM-4 stacks recomputed in the backward pass),
and prints the checkpointed / plain ratios of peak memory and step time.

The load average at the end of each size is printed with it: on a shared machine, read the times with it.

Needs ~17 GiB of free memory for the release size (8.6 GiB of float32 weights; measured peaks 12.4 GiB in float32
and 14.8 GiB under bf16 autocast; with activation checkpointing 10.4 / 10.2 GiB).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

from cadenza.models.voxcpm2 import lora as lora_ops
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.config import VoxCPM2Config
from cadenza.models.voxcpm2.minicpm4 import set_activation_checkpointing
from cadenza.models.voxcpm2.model import VoxCPM2Model
from cadenza.training.voxcpm2.losses import ItemNoise, voxcpm2_losses
from cadenza.training.voxcpm2.packer import EncodedSample, VoxCPM2Packer

FIXTURE = Path(__file__).resolve().parents[1] / "../shared/fixtures/voxcpm2/tiny_model"
PRECISIONS = ("float32", "bf16_autocast")
RELEASE_LORA = lora_ops.LoRAConfig(enable_lm=True, enable_dit=True, enable_proj=False, r=32, alpha=32.0)


def _config(size: str) -> tuple[VoxCPM2Config, AudioVAEConfig]:
    if size == "release":
        return VoxCPM2Config.official(), AudioVAEConfig.official()
    path = FIXTURE / "config.json"
    return VoxCPM2Config.from_json(path), AudioVAEConfig.from_json(path)


def _batch(config: VoxCPM2Config, vae: AudioVAEConfig, clips: int, seconds: float, text_tokens: int):
    packer = VoxCPM2Packer(None, config.patch_size, config.feat_dim, config.max_length,
                           special=config.special_tokens, frames_per_second=vae.frame_rate)
    gen = torch.Generator().manual_seed(1)
    n_patches = max(1, round(seconds * vae.frame_rate / config.patch_size))
    vocab = config.lm_config.vocab_size
    samples = [EncodedSample(torch.randint(10, vocab - 10, (text_tokens,), generator=gen).tolist(),
                             torch.randn(n_patches, config.patch_size, config.feat_dim, generator=gen))
               for _ in range(clips)]
    batch = packer.pack(samples)
    lengths = (batch.position_ids.max(dim=1).values + 1).tolist()
    return batch, lengths


def _peak_gib() -> float:
    """This process's peak resident set since the last ``_reset_peak`` (``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := the current resident set


def measure(size: str, steps: int, warmup: int, clips: int, seconds: float, text_tokens: int, threads: int,
            precisions: tuple[str, ...] = PRECISIONS, checkpointing: bool = False) -> dict:
    """Build, then time ``steps`` LoRA steps after a warm-up, in float32 and / or under bf16 autocast."""
    torch.set_num_threads(threads)
    config, vae = _config(size)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = VoxCPM2Model(config)  # torch's default initialisation: random weights, float32
    set_activation_checkpointing(model, checkpointing)
    lora_ops.apply_lora(model, RELEASE_LORA)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    for m in lora_ops.lora_modules(model).values():
        nn.init.kaiming_uniform_(m.lora_A, a=math.sqrt(5))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    build_s = time.perf_counter() - t0
    batch, lengths = _batch(config, vae, clips, seconds, text_tokens)
    result = {"size": size, "activation_checkpointing": checkpointing, "parameters": sum(p.numel() for p in model.parameters()),
              "trainable": sum(p.numel() for p in params), "packed_positions": int(batch.text_tokens.shape[1]),
              "target_patches": int(batch.loss_mask.sum()), "build_s": round(build_s, 1),
              "threads": torch.get_num_threads(), "build_peak_gib": round(_peak_gib(), 2)}
    for mode in precisions:
        times = []
        gc.collect()
        _reset_peak()
        for step in range(warmup + steps):
            noise = ItemNoise([torch.Generator().manual_seed(100 + step + i) for i in range(clips)], lengths,
                              batch.text_tokens.shape[1])
            start = time.perf_counter()
            amp = torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16_autocast" else nullcontext()
            optimizer.zero_grad(set_to_none=True)
            with amp:
                out = voxcpm2_losses(model, batch, 0.5, noise)
                loss = out.diff + out.stop
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            if step >= warmup:
                times.append(time.perf_counter() - start)
            if not math.isfinite(float(loss.detach())):
                raise RuntimeError(f"{size} {mode}: loss is not finite")
        result[f"{mode}_step_s"] = round(statistics.median(times), 3)
        result[f"{mode}_peak_gib"] = round(_peak_gib(), 2)
        optimizer.zero_grad(set_to_none=True)
        del out, loss
    result["load_average"] = round(os.getloadavg()[0], 1)
    return result


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("both", "fixture", "release"), default="both")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per precision")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--clips", type=int, default=2, help="clips in the micro-batch (the release recipe: 2)")
    parser.add_argument("--seconds", type=float, default=5.0, help="audio per clip")
    parser.add_argument("--text-tokens", type=int, default=40, help="text tokens per clip")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--precision", choices=("both", *PRECISIONS), default="both")
    parser.add_argument("--activation-checkpointing", choices=("off", "on", "both"), default="off",
                        help="without / with per-layer recomputation in the backward pass, or both (ratios printed)")
    parser.add_argument("--one", choices=("fixture", "release"), help=argparse.SUPPRESS)  # the subprocess
    parser.add_argument("--ckpt", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    precisions = PRECISIONS if args.precision == "both" else (args.precision,)
    if args.one:
        print(json.dumps(measure(args.one, args.steps, args.warmup, args.clips, args.seconds,
                                 args.text_tokens, args.threads, precisions, args.ckpt)))
        return
    sizes = ("fixture", "release") if args.size == "both" else (args.size,)
    checkpointing = {"off": (False,), "on": (True,), "both": (False, True)}[args.activation_checkpointing]
    rows = {}
    for size in sizes:
        for ckpt in checkpointing:
            if size == "release" and _available_gib() < 17:
                print(f"release size skipped: {_available_gib():.1f} GiB available, ~17 needed", file=sys.stderr)
                continue
            cmd = [sys.executable, __file__, "--one", size, "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--clips", str(args.clips), "--seconds", str(args.seconds), "--text-tokens", str(args.text_tokens),
                   "--threads", str(args.threads), "--precision", args.precision, *(["--ckpt"] if ckpt else [])]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            rows[size, ckpt] = json.loads(out.strip().splitlines()[-1])
            print(json.dumps(rows[size, ckpt]), flush=True)
    for size in sizes:
        plain, ckpt = rows.get((size, False)), rows.get((size, True))
        if plain and ckpt:
            print(f"{size}, checkpointed / plain: " + ", ".join(
                f"{p} peak {ckpt[p + '_peak_gib'] / plain[p + '_peak_gib']:.2f}x "
                f"(above the built model {_above(ckpt, p) / max(_above(plain, p), 1e-9):.2f}x), "
                f"step {ckpt[p + '_step_s'] / plain[p + '_step_s']:.2f}x" for p in precisions))
    fix, rel = rows.get(("fixture", False)), rows.get(("release", False))
    if fix and rel:
        print("release / fixture seconds per LoRA step: " + ", ".join(
            f"{p} {rel[p + '_step_s'] / fix[p + '_step_s']:.0f}x" for p in precisions))


def _above(row: dict, precision: str) -> float:
    """GiB the step's peak adds to the built model's resident set (activations, gradients, optimiser state)."""
    return row[f"{precision}_peak_gib"] - row["build_peak_gib"]


if __name__ == "__main__":
    main()
