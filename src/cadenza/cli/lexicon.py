"""``cadenza voices lexicon VOICE``: a saved voice's pronunciation lexicon (docs/text.md, "Pronunciation lexicons").

``cadenza voices lexicon alice`` prints it as JSON; ``--set FILE`` replaces it with a JSON file's entries (validated
first; an empty list removes it); ``--clear`` removes it. The server's ``/v1/audio/voices/{voice}/lexicon`` and
synthesis with the voice (server, ``cadenza synth --speaker``, the Python API) read the same lexicon.
"""

from __future__ import annotations

import argparse
import json


def add_lexicon_parser(ops) -> argparse.ArgumentParser:
    p = ops.add_parser("lexicon", help="show, set or clear a voice's pronunciation lexicon (JSON)")
    p.add_argument("voice", help="id or name")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--set", dest="lexicon_file", metavar="FILE",
                        help='replace it with this JSON file: {"entries": [{"word": ..., "respelling": ...}, ...]}')
    action.add_argument("--clear", action="store_true", help="remove it")
    return p


def run_lexicon(store, args: argparse.Namespace) -> None:
    from cadenza.text.lexicon import Lexicon
    from cadenza.voices.lexicons import lexicons_of

    lexicons = lexicons_of(store)
    record = store.get(args.voice)
    if args.lexicon_file is not None:
        lexicons.put(record.id, Lexicon.from_file(args.lexicon_file))
    elif args.clear:
        lexicons.clear(record.id)
    print(json.dumps({"voice_id": record.id, **lexicons.get(record.id).to_json()}, ensure_ascii=False, indent=2))
