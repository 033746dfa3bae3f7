"""``cadenza train STAGE --config C --data D --out DIR [--max-steps N] [--resume]``.

Single process, or many with ``torchrun --nproc_per_node N -m cadenza.cli.train STAGE ...`` (this module also runs
on its own, so torchrun needs no console script).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from cadenza.cli.args import positive_int, report_errors

STAGE_CHOICES = ("tokenizer", "frame_tokenizer", "speaker", "lm", "flow", "hift", "dpo")


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("train", help="train one component (see docs/training.md)",
                              description="Train one component; under torchrun every process runs this command.")
    _arguments(p)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("stage", choices=STAGE_CHOICES, help="component to train")
    p.add_argument("--config", required=True, help="training config (YAML or JSON); see configs/train/")
    p.add_argument("--data", required=True, help="prepared data folder (`cadenza data prepare --out`)")
    p.add_argument("--out", required=True, help="output folder: checkpoints/, metrics.jsonl, exported weights")
    p.add_argument("--max-steps", type=positive_int, default=None, help="override train.max_steps")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")


def run_train(args: argparse.Namespace) -> int:
    from cadenza.training.launcher import train

    out = train(args.stage, args.config, args.data, args.out, max_steps=args.max_steps, resume=args.resume)
    if os.environ.get("RANK", "0") == "0":
        print(f"trained {args.stage}: outputs in {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cadenza train", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    _arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return report_errors(lambda: run_train(args), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
