"""``cadenza data prepare`` (corpus -> shards), ``cadenza data extract`` (more features for prepared shards) and
``cadenza data dpo-pairs`` (preference pairs sampled from a model and scored by ASR + speaker similarity)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from cadenza.cli.args import nonnegative_float, nonnegative_int, positive_float, positive_int, report_errors, seed
from cadenza.errors import CadenzaError

LAYOUTS = ("ljspeech", "libritts", "jsonl")


def add_data_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("data", help="prepare training data (see docs/training.md)")
    _arguments(p)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="data_command", required=True)
    prep = sub.add_parser("prepare", help="validate a corpus and write feature shards (resumable)")
    prep.add_argument("--corpus", required=True, help="corpus folder, or a JSONL manifest for --layout jsonl")
    prep.add_argument("--layout", required=True, choices=LAYOUTS)
    prep.add_argument("--out", required=True, help="output folder (re-run with the same --out to resume)")
    prep.add_argument("--model", help="model folder whose speech tokenizer / speaker encoder / text tokenizer fill "
                                      "speech_tokens / spk_emb / text_ids (ONNX or trained ones; cadenza-tiny: the "
                                      "built-in model, to fine-tune it on your voice)")
    prep.add_argument("--extractor", action="append", default=[], metavar="MODULE:FACTORY[=ARG]",
                      help="an extra feature extractor (repeatable)")
    prep.add_argument("--shard-size", type=positive_int, default=256)
    prep.add_argument("--min-seconds", type=positive_float, default=0.5)
    prep.add_argument("--max-seconds", type=positive_float, default=30.0)
    prep.add_argument("--no-wav", action="store_true", help="do not store the 24 kHz waveform (HiFT needs it)")
    prep.add_argument("--no-f0", action="store_true", help="do not compute f0")
    prep.add_argument("--part", type=nonnegative_int, default=0, help="this process's part (with --num-parts)")
    prep.add_argument("--num-parts", type=positive_int, default=1,
                      help="split the shards between several processes")
    prep.add_argument("--no-progress", action="store_true")

    ext = sub.add_parser("extract", help="add features to prepared shards (sidecar files; resumable)")
    ext.add_argument("--data", required=True, help="a prepared data folder")
    ext.add_argument("--model", help="use this model folder's frontend files (tokens, x-vectors, text ids)")
    ext.add_argument("--extractor", action="append", default=[], metavar="MODULE:FACTORY[=ARG]")
    ext.add_argument("--no-progress", action="store_true")

    dpo = sub.add_parser("dpo-pairs", help="sample N candidates per text from a model, score them with offline ASR "
                                           "(+ speaker similarity) and write preference_pairs.jsonl (resumable)")
    dpo.add_argument("--manifest", required=True, help="JSON lines {id, text, prompt_wav?, prompt_text?, speaker?} "
                                                       "or a .txt file with one text per line")
    dpo.add_argument("--out", required=True, help="output folder (re-run with the same --out to resume)")
    dpo.add_argument("--model", help="the CosyVoice 2 model folder being tuned (default: the built-in cadenza-tiny)")
    dpo.add_argument("--candidates", type=positive_int, default=4, help="candidates sampled per text (>= 2)")
    dpo.add_argument("--seed", type=seed, default=0, help="base seed (each candidate's seed is recorded)")
    dpo.add_argument("--min-gap", type=nonnegative_float, default=0.05,
                     help="smallest reward difference between chosen and rejected")
    dpo.add_argument("--metric", choices=("wer", "cer"), default="wer", help="error rate of the ASR transcript")
    dpo.add_argument("--similarity-weight", type=nonnegative_float, default=0.5,
                     help="weight of the speaker similarity to the line's prompt_wav in the reward")
    dpo.add_argument("--asr", metavar="MODULE:FACTORY[=ARG]", help="another ASR scorer (default: faster-whisper base)")
    dpo.add_argument("--language", default="en", help="language of the default ASR")
    dpo.add_argument("--similarity", metavar="MODULE:FACTORY[=ARG]",
                     help="another speaker-similarity scorer (default: Resemblyzer)")
    dpo.add_argument("--no-similarity", action="store_true", help="score by the ASR alone")
    dpo.add_argument("--no-progress", action="store_true")


def _run_dpo_pairs(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from cadenza.training import preference_candidates as pc

    if args.candidates < 2:
        raise CadenzaError(f"--candidates {args.candidates}: a pair needs at least 2 candidates")
    if args.no_similarity and args.similarity:
        raise CadenzaError("give --similarity or --no-similarity, not both")
    pc.check_manifest(args.manifest)  # an empty or malformed manifest fails before anything is loaded
    transcriber = (pc.load_plugin(args.asr, "ASR", pc.Transcriber) if args.asr
                   else pc.WhisperTranscriber(args.language))
    similarity = None
    if not args.no_similarity:
        similarity = (pc.load_plugin(args.similarity, "similarity", pc.SpeakerSimilarity) if args.similarity
                      else pc.ResemblyzerSimilarity())
    settings = pc.PairSettings(candidates=args.candidates, seed=args.seed, min_gap=args.min_gap, metric=args.metric,
                               similarity_weight=args.similarity_weight if similarity is not None else 0.0,
                               asr=transcriber.name, similarity=similarity.name if similarity is not None else "")
    import cadenza

    tts = cadenza.load(args.model)
    summary = pc.generate_pairs(tts, args.manifest, args.out, settings, transcriber, similarity,
                                progress=not args.no_progress)
    print(json.dumps({k: v for k, v in asdict(summary).items() if k != "problems"}), file=sys.stderr)
    return 0


def run_data(args: argparse.Namespace) -> int:
    if args.data_command == "dpo-pairs":
        return _run_dpo_pairs(args)
    from cadenza.data.extractors import load_extractor, model_dir_extractors
    from cadenza.data.prepare import add_features, prepare
    from cadenza.data.validate import DataLimits

    extractors = [load_extractor(spec) for spec in args.extractor]
    if args.data_command == "prepare":
        if args.part >= args.num_parts:
            raise CadenzaError(f"--part {args.part} is not below --num-parts {args.num_parts} (parts count from 0)")
        if args.min_seconds >= args.max_seconds:
            raise CadenzaError(f"--min-seconds {args.min_seconds:g} must be below --max-seconds {args.max_seconds:g}")
        limits = DataLimits(min_seconds=args.min_seconds, max_seconds=args.max_seconds)
        summary = prepare(args.corpus, args.layout, args.out, model_dir=args.model, extractors=extractors,
                          shard_size=args.shard_size, limits=limits, wav=not args.no_wav, f0=not args.no_f0,
                          part=args.part, num_parts=args.num_parts, progress=not args.no_progress)
        keys = ("accepted", "rejected", "rejected_by_category", "seconds", "processed_shards", "skipped_shards", "complete")
        print(json.dumps({k: summary[k] for k in keys if k in summary}), file=sys.stderr)
        return 0
    if args.model:
        extractors = model_dir_extractors(args.model) + extractors
    if not extractors:
        raise CadenzaError("cadenza data extract needs --model and/or --extractor")
    for ex in extractors:
        print(json.dumps(add_features(args.data, ex, progress=not args.no_progress)), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cadenza data", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    _arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return report_errors(lambda: run_data(args), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
