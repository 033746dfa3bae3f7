"""A compact copy of the vocoder's training data, small enough to carry to a GPU machine (the device tool carries
64 MiB of files the repository ignores): ``--minutes`` of randomly chosen utterances of a prepared corpus as 24 kHz
16-bit FLAC files with a ``manifest.jsonl`` (``cadenza train hift``'s ``manifest`` layout; the f0 targets are
re-tracked from the audio with ``hift.f0_track: yin``). See recipes/tiny/gpu_vocoder.sh.

``python recipes/tiny/vocoder_subset.py --data WORK/data_p --minutes 20 --out .vocoder_data``
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import soundfile as sf

from cadenza.training.wav_manifest import MANIFEST_NAME, open_utterances

SAMPLE_RATE = 24000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a prepared corpus (cadenza data prepare --out)")
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    source = open_utterances(args.data)
    order = list(range(len(source)))
    random.Random(args.seed).shuffle(order)
    (args.out / "wavs").mkdir(parents=True, exist_ok=True)
    lines, seconds = [], 0.0
    for index in order:
        if seconds >= 60 * args.minutes:
            break
        wav, _ = source.load(index, SAMPLE_RATE)
        name = f"wavs/{index:05d}.flac"
        sf.write(args.out / name, wav.clamp(-1, 1).numpy(), SAMPLE_RATE, subtype="PCM_16")
        lines.append(json.dumps({"audio": name, "id": source.meta(index).id}))
        seconds += wav.shape[0] / SAMPLE_RATE
    (args.out / MANIFEST_NAME).write_text("\n".join(lines) + "\n")
    size = sum(p.stat().st_size for p in (args.out / "wavs").iterdir())
    print(f"{len(lines)} utterances, {seconds / 60:.1f} min, {size / 2**20:.1f} MiB in {args.out}")


if __name__ == "__main__":
    main()
