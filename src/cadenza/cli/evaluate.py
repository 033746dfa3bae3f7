"""``cadenza eval``: synthesise a Seed-TTS-eval test list and score it (WER, speaker similarity, naturalness,
latency, RTF)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from cadenza.cli.args import MODEL_ENV, device, nonnegative_int, positive_int, seed
from cadenza.cli.serve import default_voices_dir
from cadenza.errors import CadenzaError


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``eval`` to the ``cadenza`` sub-commands (``subparsers`` from ``add_subparsers``)."""
    p = subparsers.add_parser("eval", help="score a test list: WER, speaker similarity, naturalness (MOS proxy), "
                              "latency (docs/evaluation.md)")
    p.add_argument("--model", default=os.environ.get(MODEL_ENV),
                   help=f"model directory to synthesise with; default ${MODEL_ENV}, else the built-in "
                   "cadenza-tiny (not used with --wavs)")
    p.add_argument("--device", type=device, default="cpu", help="torch device for synthesis (cpu, cuda, ...); scoring runs on CPU")
    p.add_argument("--voices-dir", help="saved-voice store for --speaker (default $CADENZA_VOICES_DIR or "
                   "~/.local/share/cadenza/voices when it exists)")
    p.add_argument("--list", required=True, dest="test_list",
                   help="test list: 'utt_id|prompt_text|prompt_wav|target_text' lines (Seed-TTS-eval meta.lst)")
    p.add_argument("--out", required=True, help="output folder (wavs/, results.jsonl, summary.json)")
    p.add_argument("--seed", type=seed, default=0, help="random seed for every utterance (default 0)")
    p.add_argument("--speaker", help="saved speaker for lines without prompt_wav (CosyVoice 2)")
    p.add_argument("--limit", type=positive_int, help="only the first N utterances")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--wavs", metavar="DIR", help="score DIR/<utt_id>.wav instead of synthesising")
    source.add_argument("--ground-truth", action="store_true",
                        help="score the list's 5th column (target_wav recordings): the ASR's own WER")
    p.add_argument("--no-similarity", dest="similarity", action="store_false",
                   help="skip speaker similarity (WER and latency only)")
    p.add_argument("--asr-threads", type=nonnegative_int, default=0, help="CPU threads for the ASR (default: up to 4)")
    p.add_argument("--spell-numbers", action="store_true",
                   help="score WER on both texts read out by Cadenza's text normaliser (66 -> sixty-six, 21st -> "
                        "twenty-first): for lists that write numbers in words; default: as written (Seed-TTS-eval)")
    return p


def run_eval(args: argparse.Namespace) -> int:
    """Run ``cadenza eval``; prints the summary as JSON on stdout. Raises ``CadenzaError`` on bad input."""
    from tqdm import tqdm

    from cadenza.evaluation.runner import Evaluators, check_inputs, evaluate
    from cadenza.evaluation.test_list import read_test_list

    items = read_test_list(args.test_list)
    if args.limit is not None:
        items = items[: args.limit]
    synthesise = args.wavs is None and not args.ground_truth
    if not synthesise and args.speaker:
        raise CadenzaError("--speaker applies only when synthesising (not with --wavs or --ground-truth)")
    check_inputs(items, wavs_dir=args.wavs, ground_truth=args.ground_truth,
                 need_prompts=synthesise or args.similarity)  # fail fast: before loading any model
    evaluators = Evaluators(cpu_threads=args.asr_threads)
    evaluators.prepare(args.similarity)  # fail on a missing extra before loading a large model
    tts = None
    if synthesise:
        from cadenza.api import load

        voices = args.voices_dir or (str(default_voices_dir()) if default_voices_dir().is_dir() else None)
        tts = load(args.model or None, device=args.device, voices_dir=voices)  # None: the built-in cadenza-tiny
    meta = {"model": str(getattr(tts, "directory", args.model)) if synthesise else None, "list": str(args.test_list),
            "wavs": args.wavs, "speaker": args.speaker}
    try:
        with tqdm(total=len(items), desc="eval", unit="utt", disable=None, file=sys.stderr) as bar:
            def progress(done: int, total: int, result) -> None:
                bar.set_postfix_str(f"{result.id} wer={result.wer:.2f}", refresh=False)
                bar.update(1)

            summary = evaluate(items, args.out, tts=tts, wavs_dir=args.wavs, ground_truth=args.ground_truth,
                               seed=args.seed, speaker=args.speaker, similarity=args.similarity,
                               evaluators=evaluators, progress=progress, meta=meta,
                               spell_numbers=args.spell_numbers)
    finally:
        if tts is not None:
            tts.close()
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    for note in ("latency_note", "naturalness_note"):
        if summary.get(note):
            print(f"warning: {summary[note]}", file=sys.stderr)
    mos = f", naturalness {summary['naturalness_mean']:.2f}" if summary.get("naturalness_mean") is not None else ""
    print(f"wrote {args.out}/results.jsonl and summary.json: {summary['n']} utterances, WER {summary['wer_mean']:.2%} "
          f"(pooled {summary['wer_pooled']:.2%}){mos}", file=sys.stderr)
    return 0

