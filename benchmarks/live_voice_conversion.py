"""Live voice conversion (``Cadenza.live_conversion``): how far behind its source the converted audio comes, what it
costs against converting the same recording offline, and (``--asr``) whether reading the source in windows loses words.

Run: ``python benchmarks/live_voice_conversion.py [--sentences 12] [--model DIR] [--asr]``. The source is the model's
own reading of the first unseen everyday test sentences at 1.2x (another voice's timing than its default's), each
converted into the default voice. Two threads, after a warm-up:

* **real time**: the whole source pushed in 20 ms pieces at the pace it would be recorded, from a thread of its own;
  for each converted chunk its arrival after the source began. ``first audio``: the first chunk's arrival;
  ``playback delay``: how long after the source began a player must start for the output to play without a gap
  (the largest arrival of a chunk less the output time before it).
* **compute**: the same source pushed at once (as fast as the machine goes) against ``convert_voice_stream`` of it
  (the offline path, streamed: the tokenizer reads it whole, the flow's hops grow to 4 s), best of 2 each.
* ``--asr``: Whisper base (the ``eval`` extra) WER of each sentence converted live against converted whole
  (``convert_voice``), the same seed.

The last line is ``live_over_offline_compute: X`` (live seconds / offline seconds for the same source).
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import numpy as np
import torch

import cadenza
from cadenza.engine.precision import detect_cpu

SENTENCES = Path(__file__).resolve().parent.parent / "recipes" / "tiny" / "lists" / "everyday_test.txt"
PIECE_S = 0.02


def live_convert(tts, samples: np.ndarray, rate: int, paced: bool) -> tuple[np.ndarray, list[tuple[float, int]]]:
    """The conversion, and (arrival after the start in s, output samples before the chunk) of every chunk."""
    step = int(PIECE_S * rate)
    arrivals: list[tuple[float, int]] = []
    chunks = []
    with tts.live_conversion(rate, seed=0) as live:
        start = time.perf_counter()

        def produce() -> None:
            for i in range(0, samples.size, step):
                if paced:
                    delay = start + i / rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                live.push(samples[i:i + step])
            live.end()

        if paced:
            threading.Thread(target=produce, daemon=True).start()
        else:
            live.push(samples)
            live.end()
        done = 0
        for chunk in live:
            arrivals.append((time.perf_counter() - start, done))
            done += chunk.size
            chunks.append(chunk)
    return np.concatenate(chunks), arrivals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=12)
    parser.add_argument("--model", default=None, help="a CosyVoice 2 folder (default: the built-in model)")
    parser.add_argument("--asr", action="store_true", help="also the WER of live against whole conversion")
    args = parser.parse_args()
    torch.set_num_threads(2)
    tts = cadenza.load(args.model)
    sr = tts.sample_rate
    lines = [line.strip() for line in SENTENCES.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = lines[: args.sentences]
    readings = [tts.synthesize(line, seed=i, speed=1.2).samples for i, line in enumerate(lines)]
    gap = np.zeros(int(0.3 * sr), np.float32)
    source = np.concatenate([np.concatenate([r, gap]) for r in readings])
    print(f"CPU: {detect_cpu().describe()}; source: {len(lines)} sentences, {source.size / sr:.1f} s")
    live_convert(tts, source[: 3 * sr], sr, paced=False)  # warm-up

    out, arrivals = live_convert(tts, source, sr, paced=True)
    first = arrivals[0][0]
    delay = max(at - before / sr for at, before in arrivals)
    print(f"real time: first audio {first:.2f} s after the source began, playback delay {delay:.2f} s "
          f"({len(arrivals)} chunks, {out.size / sr:.2f} s of audio for {source.size / sr:.2f} s of source)")

    best = {"live": float("inf"), "offline": float("inf")}
    for _ in range(2):
        t = time.perf_counter()
        live_convert(tts, source, sr, paced=False)
        best["live"] = min(best["live"], time.perf_counter() - t)
        t = time.perf_counter()
        for _chunk in tts.convert_voice_stream((source, sr), seed=0):
            pass
        best["offline"] = min(best["offline"], time.perf_counter() - t)
    seconds = source.size / sr
    print(f"compute: live {best['live']:.2f} s (RTF {best['live'] / seconds:.3f}), offline streamed "
          f"{best['offline']:.2f} s (RTF {best['offline'] / seconds:.3f})")

    if args.asr:
        from cadenza.evaluation.asr import transcribe
        from cadenza.evaluation.wer import pooled_wer, score

        scores = {"live": [], "whole": []}
        for line, reading in zip(lines, readings):
            scores["live"].append(score(line, transcribe(live_convert(tts, reading, sr, paced=False)[0], sr)))
            scores["whole"].append(score(line, transcribe(tts.convert_voice((reading, sr), seed=0).samples, sr)))
        print(f"WER (Whisper base, {len(lines)} sentences): live {pooled_wer(scores['live']):.3f}, whole "
              f"{pooled_wer(scores['whole']):.3f}")
    tts.close()
    print(f"live_over_offline_compute: {best['live'] / best['offline']:.3f}")


if __name__ == "__main__":
    main()
