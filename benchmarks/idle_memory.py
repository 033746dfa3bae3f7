"""Resident memory of an idle process after long streams: the engine's idle-memory release against none.

Run: ``python benchmarks/idle_memory.py [--seconds 45] [--streams 3] [--model DIR]``. Each way runs in a fresh
process: load the model (the built-in one by default), stream ``--streams`` utterances of about ``--seconds`` of
audio one after another, then sit idle for 2 s; resident memory (``/proc/self/statm``) is read once loaded, right
after the last stream, and after the idle spell. ``release`` is the default (``SchedulerConfig.release_idle_memory``:
glibc's ``malloc_trim`` once the engine holds no request, ``engine/idle_memory.py``); ``keep`` turns it off. The
last line is ``release_over_keep_idle_growth: X``: the idle process's growth past the loaded model with the release
over without it (below 1: less memory held).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, time, torch
import cadenza
from cadenza.engine.scheduler_config import SchedulerConfig
way, seconds, streams, model = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] or None
torch.set_num_threads(2)
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
tts = cadenza.load(model, scheduler=SchedulerConfig(release_idle_memory=way == "release"))
tts.synthesize("Hello there.", seed=0)
loaded = rss()
sentence = "It was a bright cold day in April, and the clocks were striking thirteen. "
text = sentence * max(1, round(seconds / 3.8))
audio = 0
for i in range(streams):
    audio += sum(c.size for c in tts.synthesize_stream(text, seed=i)) / tts.sample_rate
after = rss()
time.sleep(2.0)
print(json.dumps({"loaded": loaded, "after": after, "idle": rss(), "audio_s": audio}))
"""


def run(way: str, seconds: float, streams: int, model: str | None) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, way, str(seconds), str(streams), model or ""],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--streams", type=int, default=3)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    results = {}
    for way in ("keep", "release"):
        r = results[way] = run(way, args.seconds, args.streams, args.model)
        print(f"{way:8s} loaded {r['loaded']:.0f} MB, after {args.streams} streams ({r['audio_s']:.0f} s of audio) "
              f"{r['after']:.0f} MB, idle 2 s later {r['idle']:.0f} MB")
    growth = {w: r["idle"] - r["loaded"] for w, r in results.items()}
    print(f"release_over_keep_idle_growth: {growth['release'] / max(growth['keep'], 1e-9):.3f}")


if __name__ == "__main__":
    main()
