"""What the API takes and gives as audio: ``PromptAudio`` (a voice's recording) and ``Audio`` (synthesised speech)."""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import torch

from cadenza.api.arguments import pcm_to_float, short_repr
from cadenza.audio.file_writer import AudioFileWriter
from cadenza.audio.io import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, AudioSource, load_audio, output_format, save_audio
from cadenza.audio.prompt import mono_samples
from cadenza.errors import AudioError

# Prompt audio: a path / bytes / binary file, or an already-decoded (samples, sample_rate) pair.
PromptAudio = AudioSource | tuple[np.ndarray | torch.Tensor, int]


def read_prompt_audio(audio: PromptAudio, sample_rate: int) -> tuple[torch.Tensor, int]:
    """``(mono samples [N] float32, their rate)``: a decoded pair as given (its rate checked), a file or bytes
    decoded and resampled to ``sample_rate``. Raises ``AudioError`` naming what is wrong."""
    if isinstance(audio, tuple) and not (audio and isinstance(audio[0], (str, bytes))):
        if len(audio) != 2:
            raise AudioError(f"prompt audio as a tuple is (samples, sample_rate), got {len(audio)} items")
        samples, sr = audio
        if isinstance(sr, bool) or not isinstance(sr, (int, np.integer)) \
                or not MIN_SAMPLE_RATE <= sr <= MAX_SAMPLE_RATE:
            raise AudioError(f"sample rate must be an integer from {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz, "
                             f"got {short_repr(sr)}")
        return mono_samples(torch.from_numpy(pcm_to_float(samples))), int(sr)
    try:
        return load_audio(audio, sample_rate), sample_rate
    except OSError as exc:  # a path the OS refuses outright (name too long, ...)
        raise AudioError(f"cannot read audio file {str(audio)[:200]!r}: {exc.strerror or exc}") from exc


@dataclass
class Audio:
    """Synthesised audio: float32 mono ``samples`` in [-1, 1] at ``sample_rate``."""

    samples: np.ndarray
    sample_rate: int
    words: list | None = None  # word timings (``WordTiming``) when asked for with ``timestamps=True``

    @property
    def duration(self) -> float:
        return len(self.samples) / self.sample_rate

    def _repr_html_(self) -> str:
        """A player when a notebook (Jupyter, VS Code) shows the object: the audio as an embedded 16-bit WAV."""
        buffer = io.BytesIO()
        self.save(buffer)
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        return (f'<audio controls preload="auto" src="data:audio/wav;base64,{data}"></audio>'
                f"<div><small>{self.duration:.2f} s at {self.sample_rate} Hz</small></div>")

    def save(self, path: str | os.PathLike | BinaryIO, format: str | None = None) -> None:
        """Write the audio in the format ``path``'s suffix names (or ``format``: ``"wav"``, ``"flac"``, ``"ogg"``
        (Vorbis), ``"opus"``, ``"mp3"``): ``.wav`` is 16-bit PCM, also without a suffix. A path is written whole or
        not at all (a temporary file next to it, renamed over it: a failure leaves no half-written file); a binary
        file object (``io.BytesIO()``, an HTTP body) gets the bytes, WAV unless ``format`` says otherwise. Raises
        ``InputError`` naming ``path`` when it cannot be written, ``AudioError`` for a format not written."""
        fmt = output_format(f"audio.{str(format).lstrip('.')}") if format is not None else None
        if not isinstance(path, (str, os.PathLike)):
            if isinstance(path, io.TextIOBase):
                raise AudioError("the file to save into must be opened in binary mode ('wb'), not text mode")
            save_audio(path, self.samples, self.sample_rate, fmt or ".wav")
            return
        with AudioFileWriter(path, self.sample_rate, fmt) as writer:
            writer.write(self.samples)
