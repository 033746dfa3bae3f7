"""``cadenza vc --source-wav - --live-rate HZ``: live voice conversion from standard input. Raw 16-bit little-endian
mono PCM at HZ is read as it arrives (``arecord -f S16_LE -r 16000 -c 1 -t raw | ...``) and converted as it comes
(``Cadenza.live_conversion``); the converted audio goes to ``-o`` as it is made: a file (complete or not at all) or,
with ``-o -``, a WAV stream on standard output (``... | aplay``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from cadenza.cli.args import STDIO
from cadenza.cli.audio_output import AudioOutput

FRAME_BYTES = 3200  # read at most 100 ms of 16 kHz audio at a time: a live source is passed on as it comes


def pcm16_pieces(stream: BinaryIO, frame_bytes: int = FRAME_BYTES) -> Iterator[np.ndarray]:
    """int16 pieces of a raw 16-bit little-endian stream as the bytes arrive (an odd byte waits for its pair)."""
    read = getattr(stream, "read1", stream.read)
    rest = b""
    while data := read(frame_bytes):
        data = rest + data
        cut = len(data) - len(data) % 2
        rest = data[cut:]
        if cut:
            yield np.frombuffer(data[:cut], dtype="<i2").astype(np.int16)


def run_live(tts, args) -> None:
    """Convert standard input into ``args.output`` as it arrives."""
    live = tts.live_conversion(args.live_rate, args.prompt_wav, seed=args.seed, speaker=args.speaker)
    try:
        with AudioOutput(args.output, tts.sample_rate) as sink:
            live.feed_from(pcm16_pieces(sys.stdin.buffer))
            for piece in live:
                sink.write(piece)
    finally:
        live.close()
    where = "standard output" if args.output == STDIO else args.output
    print(f"wrote {where}: {sink.samples / tts.sample_rate:.2f} s from {live.seconds_received:.2f} s of source, first "
          f"audio {sink.first_s or 0:.2f} s after the start", file=sys.stderr)
