"""``cadenza train STAGE --config C --data D --out DIR [--max-steps N] [--resume]``.

Single process, or many with ``torchrun --nproc_per_node N -m cadenza.cli.train STAGE ...`` (this module also runs
on its own, so torchrun needs no console script).

VoxCPM 2 fine-tuning starts from the release's recipe, so ``--config`` is optional there::

    cadenza train voxcpm2 --init MODEL_DIR --data DATA --out RUN [--mode lora|full] [--config overrides.yaml]
                          [--activation-checkpointing]
    cadenza train voxcpm2 --merge-lora RUN --init MODEL_DIR --out MERGED_DIR
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

from cadenza.cli.args import positive_int, report_errors
from cadenza.errors import CadenzaError

STAGE_CHOICES = ("tokenizer", "frame_tokenizer", "speaker", "lm", "flow", "hift", "dpo", "asr_reward", "token_reader",
                 "voxcpm2")
VX2 = "voxcpm2"


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("train", help="train one component (see docs/training.md)",
                              description="Train one component; under torchrun every process runs this command.")
    _arguments(p)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("stage", choices=STAGE_CHOICES, help="component to train")
    p.add_argument("--config", help="training config (YAML or JSON); see configs/train/ (optional for voxcpm2: "
                                     "laid over the release recipe)")
    p.add_argument("--data", help="prepared data folder (`cadenza data prepare --out`); voxcpm2: a folder with "
                                  "manifest.jsonl, or the .jsonl file")
    p.add_argument("--out", required=True, help="output folder: checkpoints/, metrics.jsonl, exported weights")
    p.add_argument("--max-steps", type=positive_int, default=None, help="override train.max_steps")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    vx2 = p.add_argument_group("voxcpm2")
    vx2.add_argument("--init", help="the VoxCPM 2 model folder to fine-tune (or to merge into)")
    vx2.add_argument("--mode", choices=("lora", "full"), help="LoRA adapters only (default) or every weight")
    vx2.add_argument("--activation-checkpointing", action="store_true",
                     help="recompute each transformer layer in the backward pass: less activation memory, "
                          "~1/3 more compute (voxcpm2.activation_checkpointing)")
    vx2.add_argument("--merge-lora", metavar="LORA_DIR",
                     help="fold this LoRA folder into --init and write the model folder --out (no training)")


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _voxcpm2_config(args: argparse.Namespace) -> dict:
    """The release recipe for the mode, the --config file over it, then --init / --mode."""
    from cadenza.training.config import load_config_file
    from cadenza.training.voxcpm2.stage import default_config

    given = load_config_file(args.config) if args.config else {}
    given = {k: v for k, v in given.items() if v is not None}  # an empty section means "the defaults"
    section = given.get(VX2) if isinstance(given.get(VX2), dict) else {}
    mode = args.mode or section.get("mode") or "lora"
    config = _deep_merge(default_config(mode), given)
    config[VX2] = {**config[VX2], "mode": mode, **({"init": args.init} if args.init else {})}
    if args.activation_checkpointing:
        config[VX2]["activation_checkpointing"] = True
    return config


def _merge(args: argparse.Namespace) -> int:
    from cadenza.training.voxcpm2.export import merge_lora_dir

    if not args.init:
        raise CadenzaError("--merge-lora needs --init, the model folder the adapter was trained on")
    out = merge_lora_dir(args.init, args.merge_lora, args.out)
    print(f"merged {args.merge_lora} into {args.init}: model folder {out}", file=sys.stderr)
    return 0


def run_train(args: argparse.Namespace) -> int:
    from cadenza.training.launcher import train

    if args.stage != VX2 and (args.init or args.mode or args.merge_lora or args.activation_checkpointing):
        raise CadenzaError("--init, --mode, --activation-checkpointing and --merge-lora belong to the voxcpm2 stage")
    if args.stage == VX2 and args.merge_lora:
        return _merge(args)
    if not args.data:
        raise CadenzaError("the following argument is required: --data")
    overrides = None
    with tempfile.TemporaryDirectory(prefix="cadenza-train-") as tmp:
        config = args.config
        if args.stage == VX2:
            overrides = _voxcpm2_config(args)
            if config is None:  # everything comes from the overrides
                config = Path(tmp) / "empty.yaml"
                config.write_text("{}\n", encoding="utf-8")
        elif config is None:
            raise CadenzaError("the following argument is required: --config")
        out = train(args.stage, config, args.data, args.out, max_steps=args.max_steps, resume=args.resume,
                    config_overrides=overrides)
    if os.environ.get("RANK", "0") == "0":
        print(f"trained {args.stage}: outputs in {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cadenza train", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    _arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return report_errors(lambda: run_train(args), verbose=args.verbose, unwind_on_sigterm=False)


if __name__ == "__main__":
    sys.exit(main())
