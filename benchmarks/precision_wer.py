"""The CPU fast path's intelligibility gate on the built-in model: WER of float32 against a faster precision.

Run: ``python benchmarks/precision_wer.py [--sentences 120] [--dtype auto] [--lm-int8] [--flow-int8]`` (needs the eval extra's
ASR). Each of the first ``--sentences`` lines of ``recipes/tiny/lists/everyday_test.txt`` (unseen in training) is
streamed with the default voice and seed = line number by the float32 model and by the ``--dtype`` one, transcribed
by Whisper base (beam 5, temperature 0), and scored against the text. Prints both pooled WERs, the paired
difference with a 95 % bootstrap interval over sentences, and how many utterances got better / worse. Goal (the
performance issue): the difference within noise, i.e. the interval contains 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

import cadenza
from cadenza.engine.precision import Precision, detect_cpu
from cadenza.evaluation.asr import load_asr, transcribe
from cadenza.evaluation.wer import pooled_wer, score

ROOT = Path(__file__).resolve().parent.parent


def scores_of(tts, lines: list[str], asr) -> list:
    out = []
    for k, text in enumerate(lines):
        audio = np.concatenate(list(tts.synthesize_stream(text, seed=k)))
        out.append(score(text, transcribe(audio, tts.sample_rate, model=asr, deterministic=True)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=120)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--lm-int8", action="store_true")
    parser.add_argument("--flow-int8", action="store_true")
    args = parser.parse_args()
    precision = Precision.choose(args.dtype, "cpu", lm_int8=args.lm_int8, flow_int8=args.flow_int8)
    print(f"CPU: {detect_cpu().describe()}; torch {torch.__version__}; fast path: {precision.describe()}")
    lines = [s.strip() for s in (ROOT / "recipes/tiny/lists/everyday_test.txt").read_text().splitlines()
             if s.strip()][: args.sentences]
    asr = load_asr()
    with cadenza.load() as tts:
        base = scores_of(tts, lines, asr)
    with cadenza.load(dtype=precision) as tts:
        fast = scores_of(tts, lines, asr)
    errors, errors32 = np.array([s.errors for s in fast]), np.array([s.errors for s in base])
    words = np.array([s.ref_words for s in base])
    draw = np.random.default_rng(0).integers(0, words.size, size=(4000, words.size))
    diff = (errors[draw].sum(1) - errors32[draw].sum(1)) / words[draw].sum(1)
    low, high = np.quantile(diff, [0.025, 0.975])
    print(f"{len(lines)} sentences: WER float32 {pooled_wer(base):.3f}, fast {pooled_wer(fast):.3f}, difference "
          f"{pooled_wer(fast) - pooled_wer(base):+.3f} (95 % interval {low:+.3f} .. {high:+.3f}); "
          f"{int((errors < errors32).sum())} better, {int((errors > errors32).sum())} worse")


if __name__ == "__main__":
    main()
