"""``cadenza voices``: the operator's view of a voice store, offline (no server needed): a folder (``--voices-dir``)
or the PostgreSQL database replicas share (``--voices-db``, default ``$CADENZA_VOICES_DB``).

``add NAME --audio FILE --consent ...`` (a voice from a recording, its features computed by the model it is for),
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
    add = ops.add_parser("add", help="save a voice from a recording (as POST /v1/audio/voices does), for a model")
    add.add_argument("name", help="the voice's name (letters, digits, - _ .; then synth --speaker NAME)")
    add.add_argument("--audio", required=True, help="the recording (WAV, FLAC, Ogg, MP3, ...; any rate; 0.5-30 s)")
    add.add_argument("--consent", required=True,
                     help="the speaker's consent statement, e.g. 'I am the speaker in this recording and I agree to "
                          "it being used to synthesise my voice.'")
    add.add_argument("--transcript", default=None, help="what the recording says (CosyVoice 2 zero-shot; VoxCPM 2 "
                                                       "continuation); without it the voice clones from sound alone")
    add.add_argument("--cloning", default=None, help="VoxCPM 2: reference, continuation or combined")
    add.add_argument("--declared-by", default=None, help="who declares the right to use the voice (kept with the "
                                                         "consent record; default: this user's login name)")
    add.add_argument("--keep-audio", action="store_true", help="keep the recording too (by default only the "
                                                               "features synthesis needs are kept)")
    add.add_argument("--audio-retention-days", type=float, default=None, help="with --keep-audio: for so many days")
    add.add_argument("--model", default=None, help="the model the voice is for (folder or hub name; default "
                                                   "$CADENZA_MODEL, else the built-in cadenza-tiny)")
    add.add_argument("--device", default="cpu", help="torch device for computing the features (default cpu)")
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
    if args.voices_command == "add":
        return _add(args, location)
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


def _add(args: argparse.Namespace, location: str | Path) -> None:
    """Load the model the voice is for (its features are that model's) over the store, and save the voice in one
    transaction, exactly as the server's ``POST /v1/audio/voices`` does: nothing is written unless the model can use
    it. The store is created if it does not exist yet (an explicit ``add``, unlike the other commands)."""
    import getpass
    import os

    from cadenza.api import load
    from cadenza.builtin import resolve_model_path
    from cadenza.cli.args import MODEL_ENV

    keep_for = None
    if args.audio_retention_days is not None:
        if not args.keep_audio or not 0 < args.audio_retention_days <= 3650:
            raise CadenzaError("--audio-retention-days is a number of days in (0, 3650], with --keep-audio")
        keep_for = args.audio_retention_days * 86400.0
    audio = Path(args.audio).expanduser()
    if not audio.is_file():
        raise CadenzaError(f"--audio {args.audio[:200]!r}: no such file")
    try:
        declared_by = args.declared_by or getpass.getuser()
    except (KeyError, OSError):  # no login name (a container without a passwd entry)
        declared_by = None
    if isinstance(location, Path):
        location.mkdir(parents=True, exist_ok=True)
    model = resolve_model_path(args.model or os.environ.get(MODEL_ENV) or None)
    with load(model, device=args.device, voices_dir=str(location), watermark=False) as tts:
        limit = tts.voices.max_audio_bytes
        if audio.stat().st_size > limit:
            raise CadenzaError(f"--audio {args.audio[:200]!r} is larger than the store's {limit / 2**20:.1f} MiB limit "
                               "(a voice needs 0.5-30 s of speech)")
        record = tts.voice_prompts.create(args.name, audio.read_bytes(), args.transcript, args.consent,
                                          cloning=args.cloning,
                                          declared_by=declared_by, keep_audio=args.keep_audio, audio_ttl_s=keep_for)
    print(json.dumps({"id": record.id, "name": record.name, "family": record.family, "cloning": record.cloning,
                      "transcript": record.transcript, "duration": round(record.duration, 3),
                      "declared_by": record.declared_by, "audio_kept": record.audio_kept}, ensure_ascii=False))
