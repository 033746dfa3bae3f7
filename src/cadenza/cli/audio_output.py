"""Where a command's audio goes as it is made (``-o``): a file written as the audio comes (a temporary file beside it,
renamed over it at the end, removed on an error: complete or not at all) or, for ``-``, a WAV stream on standard
output whose header says "until the end" and whose chunks go out as they come (a player reading the pipe hears them)."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from cadenza.cli.args import STDIO
from cadenza.errors import CadenzaError


def write_stdout(data: bytes) -> None:
    """Write ``data`` to standard output now. A reader that has gone (``| head -c``, a closed player) ends the command
    with one line on stderr instead of a traceback."""
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush cannot fail a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise CadenzaError("-o -: standard output was closed before the audio ended") from None


class AudioOutput:
    """``with AudioOutput(...) as out:`` ``out.write`` float32 chunks in order; leaving the block commits them, an
    error aborts (a file is then not left behind). Opened before any synthesis, so an output that cannot be written
    fails first. ``first_s``: seconds from ``started`` (a ``time.perf_counter()``) to the first chunk with audio."""

    def __init__(self, output: str, sample_rate: int, started: float | None = None) -> None:
        from cadenza.audio.file_writer import AudioFileWriter
        from cadenza.audio.wav_stream import wav_header

        self.samples = 0
        self.started = time.perf_counter() if started is None else started
        self.first_s: float | None = None
        self._file = None if output == STDIO else AudioFileWriter(output, sample_rate)
        if self._file is None:
            write_stdout(wav_header(sample_rate))

    def write(self, piece: np.ndarray) -> None:
        from cadenza.audio.wav_stream import pcm16

        if self.first_s is None and piece.size:
            self.first_s = time.perf_counter() - self.started
        self.samples += piece.size
        if self._file is not None:
            self._file.write(piece)
        elif piece.size:
            write_stdout(pcm16(piece))

    def __enter__(self) -> AudioOutput:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if self._file is None:
            return
        if kind is None:
            self._file.commit()
        else:
            self._file.abort()
