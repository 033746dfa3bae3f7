"""Voice conversion's cost against its source's length: a source past the speech tokenizer's 30 s (read in windows,
rendered chunk by chunk) costs per second what a short one does.

Run: ``python benchmarks/voice_conversion.py [--short 20] [--long 120] [--model DIR] [--source WAV]``. The source is
the built-in model's own reading of the unseen everyday test sentences (or ``--source``, tiled), cut to ``--short``
and ``--long`` seconds; each is converted into the model's default voice in a fresh process (``convert_voice``),
timed after a warm-up, with its peak resident memory. The last line is ``long_over_short_rtf: X`` (about 1: the
cost grows with the length, not faster).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SENTENCES = Path(__file__).resolve().parent.parent / "recipes" / "tiny" / "lists" / "everyday_test.txt"

CHILD = r"""
import json, resource, sys, time
import numpy as np, soundfile as sf, torch
import cadenza
seconds, model, source, sentences = float(sys.argv[1]), sys.argv[2] or None, sys.argv[3], sys.argv[4]
torch.set_num_threads(2)
tts = cadenza.load(model)
if source:
    samples, rate = sf.read(source, dtype="float32", always_2d=True)
    samples = samples.mean(axis=1)
else:
    lines = [l.strip() for l in open(sentences, encoding="utf-8") if l.strip()][:40]
    pieces = [tts.synthesize(l, seed=i).samples for i, l in enumerate(lines)]
    samples, rate = np.concatenate(pieces), tts.sample_rate
samples = np.tile(samples, int(seconds * rate / samples.size) + 1)[: int(seconds * rate)]
tts.convert_voice((samples[: 2 * rate], rate), seed=0)  # warm-up
t = time.perf_counter()
out = tts.convert_voice((samples, rate), seed=0)
wall = time.perf_counter() - t
print(json.dumps({"seconds": out.duration, "wall": wall,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(seconds: float, model: str | None, source: str | None) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(seconds), model or "", source or "", str(SENTENCES)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--short", type=float, default=20.0)
    ap.add_argument("--long", type=float, default=120.0)
    ap.add_argument("--model", default=None)
    ap.add_argument("--source", default=None)
    args = ap.parse_args()
    rtf = {}
    for name, seconds in (("short", args.short), ("long", args.long)):
        r = run(seconds, args.model, args.source)
        rtf[name] = r["wall"] / r["seconds"]
        print(f"{name:5s} {r['seconds']:6.1f} s of source converted in {r['wall']:6.1f} s (RTF {rtf[name]:.3f}), "
              f"peak {r['peak_mib']:.0f} MiB")
    print(f"long_over_short_rtf: {rtf['long'] / rtf['short']:.3f}")


if __name__ == "__main__":
    main()
