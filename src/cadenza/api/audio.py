"""What the API takes and gives as audio: ``PromptAudio`` (a voice's recording) and ``Audio`` (synthesised speech)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cadenza.audio.io import AudioSource, output_format, save_audio
from cadenza.errors import InputError

# Prompt audio: a path / bytes / binary file, or an already-decoded (samples, sample_rate) pair.
PromptAudio = AudioSource | tuple[np.ndarray | torch.Tensor, int]


@dataclass
class Audio:
    """Synthesised audio: float32 mono ``samples`` in [-1, 1] at ``sample_rate``."""

    samples: np.ndarray
    sample_rate: int
    words: list | None = None  # word timings (``WordTiming``) when asked for with ``timestamps=True``

    @property
    def duration(self) -> float:
        return len(self.samples) / self.sample_rate

    def save(self, path: str | os.PathLike) -> None:
        """Write the audio in the format ``path``'s suffix names: ``.wav`` (16-bit PCM, also without a suffix),
        ``.flac``, ``.ogg`` (Vorbis), ``.opus`` or ``.mp3``; whole or not at all: a temporary file next to ``path``
        renamed over it (a failure leaves no half-written file). Raises ``InputError`` naming ``path`` when it cannot
        be written, ``AudioError`` for another suffix."""
        import soundfile as sf

        fmt = output_format(path)
        target = Path(path).expanduser()
        tmp = None
        try:
            if target.exists() and not target.is_file():  # /dev/stdout, a FIFO: stream into it, never rename
                save_audio(target, self.samples, self.sample_rate, fmt)
                return
            tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
            save_audio(tmp, self.samples, self.sample_rate, fmt)
            os.replace(tmp, target)
            tmp = None
        except (OSError, ValueError, sf.LibsndfileError) as exc:
            reason = getattr(exc, "strerror", None) or getattr(exc, "error_string", None) or str(exc)
            raise InputError(f"cannot write {str(path)[:200]}: {reason}") from exc
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
