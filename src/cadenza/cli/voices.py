"""``cadenza voices``: the operator's view of a voice store, offline (no server needed): a folder (``--voices-dir``)
or the PostgreSQL database replicas share (``--voices-db``, default ``$CADENZA_VOICES_DB``).

``list``, ``consent ID`` (the consent record, JSON: for export), ``audit [--voice ID]`` (the append-only log),
``delete ID``, ``takedown ID --reason ...`` (delete everywhere and refuse the recording from then on).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cadenza.cli.lexicon import add_lexicon_parser, run_lexicon
from cadenza.errors import CadenzaError


def add_voices_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("voices", help="manage a saved-voice folder: list, consent records, audit, takedown")
    p.add_argument("--voices-dir", default=None, help="the voice folder (default as `cadenza serve`)")
    p.add_argument("--voices-db", default=None, metavar="postgresql://...",
                   help="the PostgreSQL voice database instead (default $CADENZA_VOICES_DB)")
    ops = p.add_subparsers(dest="voices_command", required=True)
    ops.add_parser("list", help="every voice: id, name, family, created, declared by")
    consent = ops.add_parser("consent", help="a voice's consent record as JSON (for export)")
    consent.add_argument("voice", help="id or name")
    log = ops.add_parser("audit", help="the audit log as JSON lines (oldest first)")
    log.add_argument("--voice", default=None, help="only this voice id")
    log.add_argument("--limit", type=int, default=1000)
    delete = ops.add_parser("delete", help="delete a voice and its cached features")
    delete.add_argument("voice", help="id or name")
    takedown = ops.add_parser("takedown", help="delete a voice everywhere and refuse its recording from now on")
    takedown.add_argument("voice", help="id or name")
    takedown.add_argument("--reason", required=True, help="why (kept in the audit log)")
    add_lexicon_parser(ops)
    p.set_defaults(func=run_voices)
    return p


def run_voices(args: argparse.Namespace) -> None:
    from cadenza.cli.serve import voices_location
    from cadenza.voices import VoiceStore

    location = voices_location(args)
    if isinstance(location, Path) and not (location / "voices.sqlite3").is_file():  # never create one by a typo
        raise CadenzaError(f"no voice store in {str(location)[:200]!r} (`cadenza serve --voices-dir` creates one)")
    with VoiceStore(location) as store:
        command = args.voices_command
        if command == "list":
            for r in store.list():
                print(json.dumps({"id": r.id, "name": r.name, "family": r.family, "created_at": r.created_at,
                                  "declared_by": r.declared_by}, ensure_ascii=False))
        elif command == "consent":
            print(json.dumps(store.consent_record(args.voice), ensure_ascii=False, indent=2))
        elif command == "audit":
            if args.limit < 1:
                raise CadenzaError("--limit must be at least 1")
            for event in store.audit_log(args.voice, args.limit):
                print(json.dumps(event.to_dict(), ensure_ascii=False))
        elif command == "delete":
            record = store.get(args.voice)
            store.delete(record.id)
            print(json.dumps({"deleted": record.id}))
        elif command == "takedown":
            print(json.dumps(store.takedown(args.voice, args.reason), ensure_ascii=False))
        elif command == "lexicon":
            run_lexicon(store, args)
