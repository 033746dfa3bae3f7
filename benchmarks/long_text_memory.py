"""Peak memory of a long text spoken into a file: the whole audio at once against a segment at a time.

Run: ``python benchmarks/long_text_memory.py [--sentences 120] [--threads 1] [--model DIR]``. The text is the unseen
everyday test sentences (``recipes/tiny/lists/everyday_test.txt``) repeated to ``--sentences``. Each way runs in a
fresh process with the same seed: ``whole`` is ``tts.synthesize(text).save(path)`` (every segment's audio held,
joined, then written); ``pieces`` is ``tts.synthesize_iter`` into an ``AudioFileWriter``, as ``cadenza synth -o``
does since 2026-12-07. Peak resident memory (``ru_maxrss``) and the model-loaded baseline are printed for both at
``--sentences`` and at a quarter of it, so the growth per minute of audio shows too; the last line is
``pieces_over_whole_peak_growth: X``: the pieces way's growth past the loaded model over the whole way's (below 1: less
memory).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SENTENCES = REPO / "recipes" / "tiny" / "lists" / "everyday_test.txt"

CHILD = r"""
import json, os, resource, sys, tempfile, torch
import cadenza
from cadenza.audio.file_writer import AudioFileWriter
way, n, threads, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] or None
torch.set_num_threads(threads)
lines = [l.strip() for l in open(sys.argv[5], encoding="utf-8") if l.strip()]
text = " ".join((lines * (n // len(lines) + 1))[:n])
tts = cadenza.load(model)
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "out.flac")
    if way == "whole":
        audio = tts.synthesize(text, seed=1)
        audio.save(path)
        seconds = audio.duration
    else:
        with AudioFileWriter(path, tts.sample_rate) as writer:
            for piece in tts.synthesize_iter(text, seed=1):
                writer.write(piece)
        seconds = writer.seconds
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"loaded_mb": loaded / 1024, "peak_mb": peak / 1024, "seconds": seconds}))
"""


def measure(way: str, sentences: int, threads: int, model: str | None) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, way, str(sentences), str(threads), model or "",
                           str(SENTENCES)], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=120)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    growth = {}
    print(f"{'way':<8}{'sentences':>10}{'audio (min)':>13}{'loaded (MiB)':>14}{'peak (MiB)':>12}{'growth (MiB)':>14}")
    for n in (max(1, args.sentences // 4), args.sentences):
        for way in ("whole", "pieces"):
            r = measure(way, n, args.threads, args.model)
            grew = r["peak_mb"] - r["loaded_mb"]
            growth[way, n] = grew
            print(f"{way:<8}{n:>10}{r['seconds'] / 60:>13.2f}{r['loaded_mb']:>14.0f}{r['peak_mb']:>12.0f}{grew:>14.0f}")
    n = args.sentences
    print(f"pieces_over_whole_peak_growth: {growth['pieces', n] / growth['whole', n]:.3f}")


if __name__ == "__main__":
    main()
