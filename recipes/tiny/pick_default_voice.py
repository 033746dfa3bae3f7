"""Pick cadenza-tiny's default voice: the training voice whose saved-speaker synthesis the ASR understands best.

    python recipes/tiny/pick_default_voice.py --model WORK/model [--sentences 6]     (needs the `eval` extra)

Speaks a few fixed held-out test sentences (seed 0) with every saved speaker and prints the mean WER per voice,
best first. The sentences are the first of the `seen` test list, never in training.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--work", type=Path, default=None, help="WORK folder (for the test list); default: model/..")
    p.add_argument("--sentences", type=int, default=6)
    a = p.parse_args()
    from cadenza.api import Cadenza
    from cadenza.evaluation.asr import transcribe
    from cadenza.evaluation.test_list import read_test_list
    from cadenza.evaluation.wer import wer

    work = a.work or Path(a.model).resolve().parent
    texts = [i.target_text for i in read_test_list(work / "corpus" / "test" / "seen.lst")[: a.sentences]]
    tts = Cadenza.from_pretrained(a.model)
    scores = {}
    for voice in tts.speakers:
        w = [wer(t, transcribe(tts.synthesize(t, speaker=voice, seed=0).samples, tts.sample_rate)) for t in texts]
        scores[voice] = sum(w) / len(w)
        print(f"{voice:12s} WER {scores[voice]:.3f}", flush=True)
    best = min(scores, key=scores.get)
    print(f"best: {best} ({scores[best]:.3f})")


if __name__ == "__main__":
    main()
