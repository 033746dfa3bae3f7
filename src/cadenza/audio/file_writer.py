"""``AudioFileWriter``: synthesised audio written to a file a piece at a time, so a text of any length needs memory
for the pieces in flight only (``cadenza synth --text-file BOOK.txt -o book.flac``), and the file appears whole or
not at all: the pieces go to a temporary file beside the target, renamed over it by ``commit``; ``abort`` (or an
exception inside ``with``) removes it. A link is followed to the file it ends at, which is replaced there (the link
stays a link). A target that names an open descriptor (``/dev/stdout``, ``/proc/self/fd/1``, or a link to one) or is
not a regular file (a FIFO, a device) is written directly: renaming a file over ``/dev/stdout`` would lose the audio
and break the device for every later process. The formats and their encodings are ``save_audio``'s (``io.OUTPUT_FORMATS``): the same bytes as writing
the whole signal at once, except where a format's encoder frames differ with the write sizes (Vorbis, Opus, MP3).
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

import numpy as np
import soundfile as sf

from cadenza.audio.io import (
    OUTPUT_FORMATS,
    check_finite_output,
    check_not_empty,
    encoded_samples,
    output_format,
    output_rate,
)
from cadenza.errors import AudioError, InputError


class AudioFileWriter:
    """Mono float audio at ``sample_rate`` into ``path`` in the format its suffix names (``fmt``: an
    ``OUTPUT_FORMATS`` key, e.g. ``".flac"``). ``write(samples)`` appends; ``commit()`` finishes the file.
    Raises ``InputError`` naming ``path`` when it cannot be written, ``AudioError`` for bad samples or formats."""

    def __init__(self, path: str | os.PathLike, sample_rate: int, fmt: str | None = None) -> None:
        self.fmt = fmt or output_format(path)
        self.target = Path(path).expanduser()
        container, encoding, _ = OUTPUT_FORMATS[self.fmt]
        self.in_rate, self.rate = int(sample_rate), output_rate(self.fmt, sample_rate)
        self._resampler = None
        if self.rate != self.in_rate:  # Opus and MP3 take a few rates only
            import soxr

            self._resampler = soxr.ResampleStream(self.in_rate, self.rate, 1, dtype="float32", quality="HQ")
        self.samples_written = 0  # input samples (at ``sample_rate``)
        try:
            direct, self._final = written_in_place(self.target)
            if self._final.is_dir():
                raise InputError(f"cannot write {str(path)[:200]}: it is a folder; name the audio file to write")
            if not direct and not self._final.parent.is_dir():
                raise InputError(f"cannot write {str(path)[:200]}: the folder {str(self._final.parent)[:200]!r} "
                                 "does not exist")
            self._tmp = None if direct else self._final.parent / f".{self._final.name}.{secrets.token_hex(6)}.tmp"
            self._file = sf.SoundFile(os.fspath(self._tmp or self.target), "w", samplerate=self.rate, channels=1,
                                      subtype=encoding, format=container)
        except InputError:
            raise
        except (OSError, ValueError, sf.LibsndfileError) as exc:
            reason = _reason(exc)
            if "pipe write" in reason:
                reason = (f"{container} needs a file it can seek in, and this is a pipe: write a file, or use "
                          "`cadenza synth -o -` (a WAV stream)")
            raise InputError(f"cannot write {str(path)[:200]}: {reason}") from exc

    @property
    def seconds(self) -> float:
        return self.samples_written / self.in_rate

    def write(self, samples: np.ndarray) -> None:
        """Append mono samples ``[n]`` (or ``[1, n]``); several channels are an ``AudioError``, not one long track."""
        data = np.asarray(samples, np.float32)
        if data.ndim == 2 and data.shape[0] == 1:
            data = data[0]
        if data.ndim != 1:
            raise AudioError(f"cannot save audio of shape {data.shape}: expected mono [samples] or [1, samples]")
        check_finite_output(data)
        self.samples_written += data.size
        if self._resampler is not None:
            data = self._resampler.resample_chunk(data, last=False)
        self._put(data)

    def _put(self, data: np.ndarray) -> None:
        if not data.size:
            return
        try:
            self._file.write(encoded_samples(data, self.fmt))
        except (OSError, ValueError, sf.LibsndfileError) as exc:
            raise InputError(f"cannot write {str(self.target)[:200]}: {_reason(exc)}") from exc

    def commit(self) -> None:
        """Finish the file and put it in place."""
        if self._resampler is not None:
            self._put(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))
        try:
            check_not_empty(self.samples_written, self.fmt)
        except AudioError:
            self.abort()
            raise
        try:
            self._file.close()
            if self._tmp is not None:
                os.replace(self._tmp, self._final)
                self._tmp = None
        except (OSError, ValueError, sf.LibsndfileError) as exc:
            self.abort()
            raise InputError(f"cannot write {str(self.target)[:200]}: {_reason(exc)}") from exc

    def abort(self) -> None:
        """Drop what was written (the target is left as it was)."""
        try:
            self._file.close()
        except (OSError, ValueError, sf.LibsndfileError):
            pass
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None

    def __enter__(self) -> AudioFileWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


# Paths that name an already open descriptor of the process.
_DESCRIPTOR = re.compile(r"/dev/(?:stdout|stderr|stdin|fd/\d+)|/proc/(?:self|thread-self|\d+)/fd/\d+")
_MAX_LINKS = 40  # as the kernel's own limit on a chain of links


def written_in_place(path: Path) -> tuple[bool, Path]:
    """(whether to write ``path`` directly, the regular file to replace otherwise): direct for a path that names an
    open descriptor (``/dev/stdout``; also through links, e.g. ``out -> /proc/self/fd/1``) or ends at something that
    is not a regular file; else the file a chain of links ends at (``path`` itself when it is no link)."""
    at = Path(os.path.abspath(path))
    for _ in range(_MAX_LINKS):
        if _DESCRIPTOR.fullmatch(str(at)):
            return True, at
        if not at.is_symlink():
            break
        at = Path(os.path.abspath(at.parent / os.readlink(at)))
    else:
        raise OSError(f"too many levels of links under {str(path)[:200]}")
    return (at.exists() and not at.is_file()), at


def names_stdout(path: str | os.PathLike) -> bool:
    """Whether ``path`` is standard output by name (``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``, or a link
    to one)."""
    direct, at = written_in_place(Path(path).expanduser())
    return direct and str(at) in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", f"/proc/{os.getpid()}/fd/1")


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "error_string", None) or str(exc)
