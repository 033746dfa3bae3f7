"""``cadenza assemble RUN... --out DIR [--base DIR] [--voice NAME --prompt-wav W --prompt-text T]``.

Turns stage outputs (``cadenza train lm|flow|hift --out RUN``) into one model folder that every command serves:
``assemble_model_dir`` copies the trained components over ``--base`` (a released folder, or ``cadenza-tiny``, the
built-in one) and checks that the result loads. With ``--voice`` the folder also gets a saved speaker from a
recording and makes it its default, so ``cadenza synth --model DIR`` speaks in that voice with no prompt
(docs/training.md, "Your voice on the built-in model").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cadenza.errors import CadenzaError


def add_assemble_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("assemble", help="make one model folder from trained stages (see docs/training.md)")
    p.add_argument("runs", nargs="+", metavar="RUN", help="stage output folders (later ones win)")
    p.add_argument("--out", required=True, help="the new model folder (must not exist yet)")
    p.add_argument("--base", help="a model folder that supplies what no stage trained (cadenza-tiny: the built-in one)")
    p.add_argument("--voice", metavar="NAME", help="save --prompt-wav as this speaker and make it the default")
    p.add_argument("--prompt-wav", help="a recording of the voice (0.5-30 s; one of the training recordings will do)")
    p.add_argument("--prompt-text", help="what --prompt-wav says")
    return p


def run_assemble(args) -> None:
    from cadenza.models.cosyvoice2.speakers import validate_speaker_id
    from cadenza.training.export import assemble_model_dir

    voice = (args.voice, args.prompt_wav, args.prompt_text)
    if any(v is not None for v in voice) and not all(v is not None for v in voice):
        raise CadenzaError("--voice, --prompt-wav and --prompt-text go together")
    if args.voice is not None:
        validate_speaker_id(args.voice)
        if not Path(args.prompt_wav).is_file():
            raise CadenzaError(f"--prompt-wav {args.prompt_wav!r} is not a file")
    out = Path(args.out).expanduser()
    if out.exists():
        raise CadenzaError(f"--out {out} exists: assemble into a new folder")
    try:
        assemble_model_dir(*args.runs, out=out, base=args.base)
        if args.voice is not None:
            _default_voice(out, args.voice, args.prompt_wav, args.prompt_text)
    except BaseException:
        import shutil

        shutil.rmtree(out, ignore_errors=True)  # no half-made folder that would load as something it is not
        raise
    print(f"assembled {out}", file=sys.stderr)


def _default_voice(model_dir: Path, name: str, prompt_wav: str, prompt_text: str) -> None:
    """Save the voice in ``spk2info.pt`` and name it the default in ``cadenza.json``."""
    from cadenza.api import load
    from cadenza.builtin import METADATA_NAME, read_model_metadata

    tts = load(str(model_dir))
    try:
        tts.add_speaker(name, prompt_wav, prompt_text)
    finally:
        tts.close()
    doc = read_model_metadata(model_dir) or {"format": "cadenza.model", "name": model_dir.resolve().name}
    doc["default_speaker"] = name
    doc["speaker_prompts"] = {**doc.get("speaker_prompts", {}), name: prompt_text}
    doc["voices"] = [*(v for v in doc.get("voices", []) if v.get("name") != name),
                     {"name": name, "source": f"a recording ({Path(prompt_wav).name}) saved by cadenza assemble"}]
    (model_dir / METADATA_NAME).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
