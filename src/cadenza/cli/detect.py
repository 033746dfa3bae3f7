"""``cadenza detect FILE``: does this audio carry Cadenza's provenance watermark, and with which payload?

Prints one JSON object: ``{"found": bool, "payload": "8 hex digits" or null, "score": float}``. The exit status
is 0 whenever the file could be read (found or not), 2 for a file or key that cannot be used. See
docs/provenance.md for what ``found`` and ``score`` mean and how reliable they are.
"""

from __future__ import annotations

import argparse
import json

MAX_SECONDS = 600.0  # the mark repeats every 0.48 s; ten minutes is plenty, and bounds the memory a file can take


def add_detect_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``detect`` to the ``cadenza`` sub-commands (``subparsers`` from ``add_subparsers``)."""
    p = subparsers.add_parser("detect", help="look for Cadenza's provenance watermark in an audio file "
                              "(docs/provenance.md)")
    p.add_argument("file", help="audio file (WAV, FLAC, OGG/Opus, MP3, M4A/AAC, WebM, ...: any the server "
                   "writes or takes as a voice; any rate; at least 0.5 s)")
    p.add_argument("--key-file", help="the operator's key file (default: Cadenza's public key, which proves only "
                   "'made with Cadenza', not who made it)")
    p.add_argument("--threshold", type=float, help="score needed for found (default: the documented one)")
    return p


def run_detect(args: argparse.Namespace) -> int:
    """Run ``cadenza detect``; prints the result as JSON on stdout. Raises ``CadenzaError`` on bad input."""
    from cadenza.audio.io import load_audio
    from cadenza.provenance import Watermark
    from cadenza.provenance.detector import DETECT_RATE
    from cadenza.provenance.keys import DEFAULT_KEY, load_key

    key = load_key(args.key_file) if args.key_file else DEFAULT_KEY
    options = {} if args.threshold is None else {"threshold": args.threshold}
    watermark = Watermark(key, DETECT_RATE, **options)  # validates --threshold before the file is read
    # Decoded straight to the detector's rate: one resampling, by the same soxr filter.
    audio = load_audio(args.file, DETECT_RATE, max_bytes=None, max_seconds=MAX_SECONDS)
    detection = watermark.detect(audio.numpy(), DETECT_RATE)
    print(json.dumps(detection.to_json()))
    return 0
