"""cadenza-tiny v2 milestones, stage by stage, on the everyday test sentences (never trained on).

    python recipes/tiny/diagnose_v2.py --work WORK [--model DIR] [--limit 120]      (needs the `eval` extra)

For each sentence of ``WORK/corpus_v2/test/everyday.lst`` and the teacher's own rendering of it (Piper joe):

* ``teacher``         the rendering itself (the ASR's floor on this voice and text);
* ``vocoder``         its mel -> HiFT (copy synthesis: what the vocoder alone loses);
* ``vc_oracle``       its alignment tokens (the teacher's own timings) -> flow -> HiFT (what the flow loses);
* ``vc``              its audio -> the trained tokenizer -> flow -> HiFT (voice conversion: milestone M1);
* ``tts``             text -> LM -> flow -> HiFT with the default voice, no prompt given (what `cadenza synth`
                      does: milestone M2).

Prints one line per utterance and stage, then per stage the mean WER (Whisper base at temperature 0, so that two
models compare on the same footing), the pooled WER (errors over all reference words), the share of reference words
the ASR heard, the share of voiced 10 ms frames (YIN from 60 Hz: the breathiness measure; the teacher's own share is
the target) and (for ``vc``) the tokenizer's frame accuracy against the alignment; writes WORK/eval/diagnose_v2.json (``--out``). A v1 folder works for the ``tts`` stage (its default
voice), which gives the v1 baseline on the same sentences.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def diagnose(work: Path, model: str | None, limit: int, seed: int = 0, stages: tuple[str, ...] = (),
             out: Path | None = None) -> dict:
    import torch

    from cadenza.api import Cadenza
    from cadenza.audio.io import load_audio
    from cadenza.audio.mel import flow_prompt_mel
    from cadenza.audio.pitch import yin_f0
    from cadenza.audio.resample import resample
    from cadenza.engine.request import SynthesisRequest
    from cadenza.evaluation.asr import transcribe
    from cadenza.evaluation.test_list import read_test_list
    from cadenza.evaluation.wer import recognized_words
    from cadenza.evaluation.wer import score as word_score

    tts = Cadenza.from_pretrained(model)
    eng = tts.engine
    cfg = eng.config
    test = work / "corpus_v2" / "test"
    items = read_test_list(test / "everyday.lst")[:limit]
    voice = eng.speakers.get(tts.default_speaker or "joe")
    stages = stages or ("teacher", "vocoder", "vc_oracle", "vc", "tts")
    results: dict[str, list[tuple[float, float, int, int]]] = {}
    frame_acc: list[float] = []
    started = time.time()

    def score(stage: str, item, samples: np.ndarray, sr: int) -> None:
        hyp = transcribe(samples, sr, deterministic=True)
        hits, n_words = recognized_words(item.target_text, hyp)
        s = word_score(item.target_text, hyp)
        f0 = yin_f0(torch.from_numpy(np.ascontiguousarray(samples, np.float32)), sr, sr // 100, fmin=60.0)
        voiced = float((f0 > 0).float().mean())
        results.setdefault(stage, []).append((s.wer, hits / n_words, s.errors, s.ref_words, voiced))
        print(f"{stage:10s} {results[stage][-1][0]:5.2f} | {item.target_text} | {hyp}", flush=True)

    for item in items:
        reference = test / "reference" / f"{item.utt_id}.wav"
        labels = json.loads(reference.with_suffix(".json").read_text())["speech_tokens"]
        wav = load_audio(reference, cfg.sample_rate)
        if "teacher" in stages:
            score("teacher", item, wav.numpy(), cfg.sample_rate)
        if "vocoder" in stages:
            with torch.no_grad():
                copy, _ = eng.model.hift(flow_prompt_mel(wav, cfg.mel), generator=torch.Generator().manual_seed(seed))
            score("vocoder", item, copy[0].numpy(), cfg.sample_rate)
        if "vc_oracle" in stages:
            req = SynthesisRequest(mode="vc", voice=voice, source_tokens=torch.tensor([labels]), seed=seed)
            score("vc_oracle", item, eng.synthesize(req), cfg.sample_rate)
        if "vc" in stages:
            tokens = eng.frontend.speech_tokens(resample(wav, cfg.sample_rate, 16000))
            n = min(tokens.shape[1], len(labels))
            frame_acc.append(float((tokens[0, :n] == torch.tensor(labels[:n])).float().mean()))
            req = SynthesisRequest(mode="vc", voice=voice, source_tokens=tokens, seed=seed)
            score("vc", item, eng.synthesize(req), cfg.sample_rate)
        if "tts" in stages:
            audio = tts.synthesize(item.target_text, seed=seed)
            score("tts", item, audio.samples, audio.sample_rate)
    tts.close()
    summary = {stage: {"wer_mean": float(np.mean([r[0] for r in rows])),
                       "wer_pooled": sum(r[2] for r in rows) / max(sum(r[3] for r in rows), 1),
                       "words_heard": float(np.mean([r[1] for r in rows])),
                       "voiced_frames": float(np.mean([r[4] for r in rows])), "n": len(rows)}
               for stage, rows in results.items()}
    if frame_acc:
        summary["vc"]["tokenizer_frame_acc"] = float(np.mean(frame_acc))
    for stage, s in summary.items():
        extra = f"  tokenizer frame accuracy {s['tokenizer_frame_acc']:.1%}" if "tokenizer_frame_acc" in s else ""
        print(f"{stage:10s} WER {s['wer_mean']:.3f} (pooled {s['wer_pooled']:.3f})  words heard {s['words_heard']:.0%}"
              f"  voiced {s['voiced_frames']:.0%}  (n={s['n']}){extra}")
    out = out or work / "eval" / "diagnose_v2.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": model, "limit": limit, "seed": seed, "stages": summary,
                               "seconds": round(time.time() - started)}, indent=1))
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--model", default=None, help="model folder (default: the built-in cadenza-tiny)")
    p.add_argument("--limit", type=int, default=120)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", nargs="*", default=[], help="a subset of: teacher vocoder vc_oracle vc tts")
    p.add_argument("--out", type=Path, default=None, help="summary JSON (default WORK/eval/diagnose_v2.json)")
    a = p.parse_args()
    diagnose(a.work, a.model, a.limit, a.seed, tuple(a.stages), a.out)


if __name__ == "__main__":
    main()
