"""Measure cadenza-tiny against its teachers on the fixed test lists (docs/cadenza-tiny.md's tables).

    python recipes/tiny/evaluate.py --work WORK [--model DIR]       (needs the `eval` extra)

For each list (`seen`: training voices, `heldout`: voices never trained on) it runs `cadenza eval` twice with the
same ASR: on the teachers' own renderings of the test sentences (the WER baseline) and on cadenza-tiny's zero-shot
clones (prompt wav + transcript -> target text, streaming). For the held-out voices it also scores every clone
against the prompts of all *other* test voices: a clone should resemble its own prompt clearly more than any other
voice. Writes WORK/eval/report.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def _eval(args: list[str]) -> dict:
    from cadenza.cli.main import main as cli

    out = Path(args[args.index("--out") + 1])
    if not (out / "summary.json").is_file():
        if cli(["eval", *args]) != 0:
            raise SystemExit(f"cadenza eval failed: {args}")
    return json.loads((out / "summary.json").read_text())


def cross_similarity(work: Path, kind: str, clones: Path) -> dict[str, float]:
    """Similarity of each clone to its own prompt vs to the other test voices (mean over each voice's prompts).

    Returns the means of: own-prompt similarity, similarity to all other voices, similarity to the *closest* other
    voice, and the share of clones closer to their own prompt than to every other voice (identification rate)."""
    from cadenza.evaluation.speaker_similarity import cosine, embed_file
    from cadenza.evaluation.test_list import read_test_list

    test = work / "corpus" / "test"
    prompt_emb = {path.resolve(): embed_file(path) for path in sorted((test / "prompts").glob("*.wav"))}
    voices: dict[str, list] = defaultdict(list)
    for path, emb in prompt_emb.items():
        voices[path.stem.rsplit("_", 1)[0]].append(emb)
    own, others, closest, identified = [], [], [], 0
    for item in read_test_list(test / f"{kind}.lst"):
        wav = clones / "wavs" / f"{item.utt_id}.wav"
        if not wav.is_file():
            continue
        e = embed_file(wav)
        voice = Path(item.prompt_wav).stem.rsplit("_", 1)[0]
        prompt = Path(item.prompt_wav).resolve()
        own.append(cosine(e, prompt_emb[prompt] if prompt in prompt_emb else embed_file(prompt)))
        other = [sum(cosine(e, pe) for pe in embs) / len(embs) for v, embs in voices.items() if v != voice]
        others.extend(other)
        closest.append(max(other))
        identified += own[-1] > max(other)
    mean = lambda v: sum(v) / len(v) if v else float("nan")  # noqa: E731
    return {"own_prompt": mean(own), "other_voices": mean(others), "closest_other_voice": mean(closest),
            "identification_rate": identified / max(len(own), 1), "n": len(own)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--model", default=None, help="model folder (default: the built-in cadenza-tiny)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--kinds", nargs="+", default=["seen", "heldout"], choices=["seen", "heldout"],
                   help="which lists (run one per process to use several cores; a later full run reuses them)")
    a = p.parse_args()
    test, ev = a.work / "corpus" / "test", a.work / "eval"
    limit = ["--limit", str(a.limit)] if a.limit else []
    model = ["--model", a.model] if a.model else []
    report: dict[str, dict] = {}
    for kind in a.kinds:
        lst = str(test / f"{kind}.lst")
        report[f"teacher_{kind}"] = _eval(["--list", lst, "--wavs", str(test / "reference"),
                                           "--out", str(ev / f"teacher_{kind}"), *limit])
        report[f"tiny_{kind}"] = _eval(["--list", lst, "--out", str(ev / f"tiny_{kind}"), "--seed", "0",
                                        *model, *limit])
        report[f"similarity_{kind}"] = cross_similarity(a.work, kind, ev / f"tiny_{kind}")
    if set(a.kinds) != {"seen", "heldout"}:
        return
    (ev / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print("| voices | teacher WER | cadenza-tiny WER | ratio | SIM to prompt | SIM to other voices (closest) |"
          " identified | first chunk (s) | RTF |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind in ("seen", "heldout"):
        t, m, s = report[f"teacher_{kind}"], report[f"tiny_{kind}"], report[f"similarity_{kind}"]
        print(f"| {kind} | {t['wer_mean']:.3f} | {m['wer_mean']:.3f} | {m['wer_mean'] / max(t['wer_mean'], 1e-9):.2f} | "
              f"{s['own_prompt']:.3f} | {s['other_voices']:.3f} ({s['closest_other_voice']:.3f}) | "
              f"{s['identification_rate']:.0%} | {m['first_chunk_s_mean']:.3f} | {m['rtf_mean']:.3f} |")


if __name__ == "__main__":
    main()
