"""First chunk of cloned voices: the first hop one chunk for any prompt (the default) against the reference's first hop,
which ends on the flow's chunk grid (25 to 49 new tokens, by the prompt's length), in the same run.

Run: ``python benchmarks/first_chunk_any_voice.py [--repeats 3] [--threads 1] [--model DIR]`` (default: the built-in
model). The voices are cloned from speech the model itself makes (six prompt sentences, so their prompts have six
lengths), each used for the same texts in both modes, alternating, with the same seed. A stall is time a player
reading the chunks in order would have waited. The headline line comes last:
``one_chunk_over_on_grid_first_chunk: X`` (median first chunk, one-chunk first hop / on the grid).
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch
from playback import play

import cadenza
from cadenza.engine.stream_schedule import StreamSchedule

PROMPTS = (
    "I call upon the God of my fathers to be merciful to my race.",
    "The kettle takes a few minutes to boil in the morning.",
    "Please leave the package at the front desk.",
    "We walked along the river until the sun went down behind the hills.",
    "It was a quiet evening.",
    "My brother finally fixed the squeaky door in the hallway.",
)
TEXTS = (
    "Sure, I can help you with that.",
    "The train leaves at nine tomorrow morning.",
)


def stream_once(tts, text: str, voice: np.ndarray, seed: int) -> tuple[float, float]:
    """(first chunk s, stall s) of one streamed text in the voice cloned from ``voice`` (24 kHz samples)."""
    return play(tts.synthesize_stream(text, prompt_wav=(voice, tts.sample_rate), seed=seed), tts.sample_rate)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    modes = {
        "one chunk": cadenza.load(a.model, stream_schedule=StreamSchedule()),
        "on the grid": cadenza.load(a.model, stream_schedule=StreamSchedule(first_hop_on_grid=True)),
    }
    try:
        maker = modes["one chunk"]
        voices = [maker.synthesize(text, seed=0).samples for text in PROMPTS]
        lengths = [maker.voice_from_audio((v, maker.sample_rate)).flow_prompt_speech.shape[1] for v in voices]
        print("prompt tokens:", lengths, "(mod 25:", [n % 25 for n in lengths], ")")
        for tts in modes.values():
            stream_once(tts, "Warm up.", voices[0], 0)
        results = {name: ([], []) for name in modes}
        for r in range(a.repeats):
            for i, voice in enumerate(voices):
                for j, text in enumerate(TEXTS):
                    order = list(modes) if (r + i + j) % 2 == 0 else list(reversed(modes))
                    for name in order:
                        first, stall = stream_once(modes[name], text, voice, seed=r)
                        results[name][0].append(first)
                        results[name][1].append(stall)
        for name, (firsts, stalls) in results.items():
            print(f"{name}: first chunk median {statistics.median(firsts):.3f} s (mean {statistics.mean(firsts):.3f}), "
                  f"stalled streams {sum(s > 0.005 for s in stalls)} of {len(stalls)}, stall total {sum(stalls):.2f} s")
        ratio = statistics.median(results["one chunk"][0]) / statistics.median(results["on the grid"][0])
        print(f"one_chunk_over_on_grid_first_chunk: {ratio:.3f}")
    finally:
        for tts in modes.values():
            tts.close()


if __name__ == "__main__":
    main()
