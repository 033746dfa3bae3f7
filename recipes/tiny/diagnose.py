"""Where does cadenza-tiny lose intelligibility? ASR WER at each stage boundary, on the same test sentences.

    python recipes/tiny/diagnose.py --work WORK [--model DIR] [--limit 12]      (needs the `eval` extra)

For the first ``--limit`` sentences of the `seen` test list, with the teacher's own rendering of each sentence:

* ``teacher``        the rendering itself (the ASR's floor on this voice and text);
* ``vocoder``        its mel -> HiFT (copy synthesis: what the vocoder alone loses);
* ``flow+vocoder``   its speech tokens -> flow (prompted by the list's prompt) -> HiFT (voice conversion: what the
                     tokenizer and flow add);
* ``zero-shot``      text + prompt -> LM -> flow -> HiFT (the whole model; also what `evaluate.py` measures);
* ``cross-lingual``  text + prompt audio only (no prompt transcript, no prompt tokens in the LM).

Prints one line per utterance and stage, then per stage the mean WER, the share of reference words the ASR heard (in
order; unlike WER, not lowered by words it adds) and the voiced-frame share, and writes WORK/eval/diagnose.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def _voiced_share(samples: np.ndarray, sr: int) -> float:
    import torch

    from cadenza.audio.pitch import yin_f0

    return float((yin_f0(torch.from_numpy(samples.astype(np.float32)), sr, sr // 50) > 0).float().mean())


def diagnose(work: Path, model: str | None, limit: int, seed: int = 0) -> dict[str, dict[str, float]]:
    import torch

    from cadenza.api import Cadenza
    from cadenza.audio.io import load_audio
    from cadenza.audio.mel import flow_prompt_mel
    from cadenza.evaluation.asr import transcribe
    from cadenza.evaluation.test_list import read_test_list
    from cadenza.evaluation.wer import recognized_words, wer

    tts = Cadenza.from_pretrained(model)
    cfg = tts.engine.config
    hift = tts.engine.model.hift
    test = work / "corpus" / "test"
    items = read_test_list(test / "seen.lst")[:limit]
    results: dict[str, list[tuple[float, float, float]]] = {}

    def score(stage: str, item, samples: np.ndarray, sr: int) -> None:
        hyp = transcribe(samples, sr)
        hits, n_words = recognized_words(item.target_text, hyp)
        results.setdefault(stage, []).append((wer(item.target_text, hyp), hits / n_words, _voiced_share(samples, sr)))
        print(f"{stage:14s} {results[stage][-1][0]:5.2f} | {item.target_text} | {hyp}", flush=True)

    for item in items:
        reference = test / "reference" / f"{item.utt_id}.wav"
        wav = load_audio(reference, cfg.sample_rate)
        score("teacher", item, wav.numpy(), cfg.sample_rate)
        with torch.no_grad():
            mel = flow_prompt_mel(wav, cfg.mel)
            copy, _ = hift(mel, generator=torch.Generator().manual_seed(seed))
        score("vocoder", item, copy[0].numpy(), cfg.sample_rate)
        vc = tts.convert_voice(str(reference), str(item.prompt_wav), seed=seed)
        score("flow+vocoder", item, vc.samples, vc.sample_rate)
        zs = tts.synthesize(item.target_text, prompt_wav=str(item.prompt_wav), prompt_text=item.prompt_text, seed=seed)
        score("zero-shot", item, zs.samples, zs.sample_rate)
        cl = tts.synthesize(item.target_text, prompt_wav=str(item.prompt_wav), seed=seed)
        score("cross-lingual", item, cl.samples, cl.sample_rate)
    tts.close()
    summary = {stage: {"wer_mean": float(np.mean([r[0] for r in rows])), "words_heard": float(np.mean([r[1] for r in rows])),
                       "voiced": float(np.mean([r[2] for r in rows])), "n": len(rows)} for stage, rows in results.items()}
    for stage, s in summary.items():
        print(f"{stage:14s} WER {s['wer_mean']:.3f}  words heard {s['words_heard']:.0%}  voiced frames {s['voiced']:.0%}"
              f"  (n={s['n']})")
    out = work / "eval" / "diagnose.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": model, "limit": limit, "seed": seed, "stages": summary}, indent=1))
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--model", default=None, help="model folder (default: the built-in cadenza-tiny)")
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    diagnose(a.work, a.model, a.limit, a.seed)


if __name__ == "__main__":
    main()
