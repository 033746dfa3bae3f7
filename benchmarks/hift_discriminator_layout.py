"""The vocoder's discriminators, forward and backward, with the spectrogram discriminators' activations channels-first
against channels-last (``DiscriminatorConfig.spec_channels_last``), timed in one run: seconds per pass and their ratio.

The spectrogram discriminators run a few channels (16 in cadenza-tiny's CPU rounds, 32 in the reference) of 2-D
convolutions over whole STFT magnitudes (up to 193 x 1025 per crop); oneDNN's kernels for such shapes are far
faster on channels-last tensors on a CPU. Both layouts compute the same values
(tests/training/test_train_hift.py::test_spectrogram_discriminators_score_the_same_in_either_memory_layout), so the
ratio is pure speed. Sizes: ``tiny`` is cadenza-tiny's vocoder round on a CPU (``recipes/tiny/configs/
hift_joe_even.yaml``: the narrow discriminators with the frame-period ones, 0.4 s crops, batch 6, real and generated
scored together: 12 crops); ``release`` the reference's widths on its 1.02 s crops. Passes of the two layouts
alternate, so a noisy machine slows both alike; medians are reported, the ratio last.

    python benchmarks/hift_discriminator_layout.py [--size tiny|release] [--passes 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from cadenza.training.hift.config import DiscriminatorConfig
from cadenza.training.hift.discriminators import HiFTDiscriminator

SIZES = {
    "tiny": ({"periods": (2, 3, 5, 7, 11, 240, 480), "period_channels": (16, 32, 64, 64), "spec_channels": 16},
             12, 9600),
    "release": ({}, 12, 24480),
}


def cpu_flags() -> str:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return platform.processor() or "unknown"
    return ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "none listed"


def one_pass(disc: HiFTDiscriminator, wav: torch.Tensor) -> float:
    """Seconds for scoring ``wav [B, L]`` and back-propagating a loss over every score and feature map."""
    disc.zero_grad(set_to_none=True)
    start = time.perf_counter()
    scores, maps = disc.score(wav)
    loss = sum(s.mean() for s in scores) + sum(m.abs().mean() for fm in maps for m in fm)
    loss.backward()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    widths, batch, samples = SIZES[args.size]
    discs = {}
    for layout in ("channels_first", "channels_last"):
        torch.manual_seed(0)
        discs[layout] = HiFTDiscriminator(DiscriminatorConfig(**widths, spec_channels_last=layout == "channels_last"))
    wav = torch.randn(batch, samples) * 0.1
    times: dict[str, list[float]] = {layout: [] for layout in discs}
    for i in range(args.warmup + args.passes):
        for layout, disc in discs.items():
            t = one_pass(disc, wav)
            if i >= args.warmup:
                times[layout].append(t)
    medians = {layout: statistics.median(t) for layout, t in times.items()}
    print(json.dumps({"size": args.size, "crops": batch, "samples": samples, "threads": args.threads,
                      "cpu": platform.processor() or platform.machine(), "cpu_flags": cpu_flags(),
                      "torch": torch.__version__, "seconds_per_pass": {k: round(v, 4) for k, v in medians.items()}}))
    print(f"channels_last_over_channels_first: {medians['channels_last'] / medians['channels_first']:.3f}")


if __name__ == "__main__":
    main()
