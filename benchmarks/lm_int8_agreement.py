"""The int8 LM's quality gate on the built-in model: greedy-token agreement with float32, teacher-forced.

Run: ``python benchmarks/lm_int8_agreement.py [--sentences 120]``.

For each of the first ``--sentences`` lines of ``recipes/tiny/lists/everyday_test.txt`` (unseen in training), the
float32 LM samples the speech tokens (default voice, seed = line number), then each LM reads that same sequence
(teacher forcing) and we count the steps where its most likely speech token is float32's. Two int8 schemes
(engine/precision.py, ``lm_int8_scheme``): ``weights`` (int8 weights x bfloat16 activations, where the CPU computes
bfloat16 in hardware) and ``dynamic`` (torch's dynamic quantization). Also the mean and 99th percentile of the
total-variation distance between the next-token distributions, and the time per batch-1 decode step (one thread).
Goal (the performance issue): agreement >= 99 %. Prints the CPU first.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import numpy as np
import torch

import cadenza
from cadenza.engine.precision import CpuCapability, detect_cpu, lm_int8_scheme, quantize_lm

ROOT = Path(__file__).resolve().parent.parent


def read_along(lm, request, tokens: list[int]) -> torch.Tensor:
    """Next-token probabilities over the speech vocabulary at each step of ``tokens``: ``[len(tokens), V]``."""
    speech = lm.cfg.speech_token_size
    cache = lm.new_cache(request.text_ids.shape[1] + request.lm_prompt_text.shape[1]
                         + request.lm_prompt_speech.shape[1] + len(tokens) + 4)
    logp = lm._step(lm.build_input(request.text_ids, request.lm_prompt_text, request.lm_prompt_speech), cache, None)
    out = []
    for token in tokens:
        out.append(logp[:speech].exp())
        logp = lm._step(lm.speech_step_input(token), cache, None)
    return torch.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=120)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cpu = detect_cpu()
    print(f"CPU: {cpu.describe()}; torch {torch.__version__}; one thread")
    lines = [s.strip() for s in (ROOT / "recipes/tiny/lists/everyday_test.txt").read_text().splitlines()
             if s.strip()][: args.sentences]
    with cadenza.load() as tts:
        base = tts.engine.model.lm
        schemes = {"dynamic": quantize_lm(copy.deepcopy(base), CpuCapability("", avx2=True))}
        if lm_int8_scheme() == "weights":
            schemes = {"weights": quantize_lm(copy.deepcopy(base), cpu), **schemes}
        agree = {name: 0 for name in schemes}
        distance = {name: [] for name in schemes}
        seconds = {name: 0.0 for name in ("float32", *schemes)}
        steps = 0
        with torch.inference_mode():
            for k, text in enumerate(lines):
                request = tts.request(text, seed=k)
                tokens = list(base.generate(request.text_ids, request.lm_prompt_text, request.lm_prompt_speech,
                                            generator=torch.Generator().manual_seed(k)))
                start = time.perf_counter()
                probs32 = read_along(base, request, tokens)
                seconds["float32"] += time.perf_counter() - start
                greedy32 = probs32.argmax(-1)
                for name, lm in schemes.items():
                    start = time.perf_counter()
                    probs = read_along(lm, request, tokens)
                    seconds[name] += time.perf_counter() - start
                    agree[name] += int((probs.argmax(-1) == greedy32).sum())
                    distance[name].append(0.5 * (probs - probs32).abs().sum(-1))
                steps += len(tokens)
    print(f"{len(lines)} sentences, {steps} teacher-forced steps")
    print(f"{'LM':<9} {'agreement':>10} {'TV mean':>8} {'TV p99':>7} {'ms/step':>8}")
    print(f"{'float32':<9} {'-':>10} {'-':>8} {'-':>7} {1000 * seconds['float32'] / steps:8.3f}")
    for name in schemes:
        tv = torch.cat(distance[name]).numpy()
        print(f"{name:<9} {agree[name] / steps:10.2%} {tv.mean():8.4f} {np.quantile(tv, 0.99):7.4f} "
              f"{1000 * seconds[name] / steps:8.3f}")


if __name__ == "__main__":
    main()
