"""What a saved voice is, whatever database holds it: ``VoiceRecord``, and the keys that identify a voice's name and
its recording (``name_key``, ``audio_hash``)."""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import asdict, dataclass

import numpy as np
import torch

from cadenza.errors import InputError

# Voices of stores older than the family columns (SQLite schema < 3) were all made for CosyVoice 2.
DEFAULT_FAMILY = "cosyvoice2"


def name_key(name: str) -> str:
    """What makes two voice names the same name: Unicode NFC, then full case folding (``'Straße'`` = ``'STRASSE'``)."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold())


def audio_hash(pcm16: np.ndarray) -> str:
    """SHA-256 (hex) of a recording's 16-bit samples as stored: the same recording uploaded again (the same file, or
    a lossless copy with the same samples) hashes the same; an edited or lossily re-encoded one does not."""
    return hashlib.sha256(np.ascontiguousarray(pcm16, dtype="<i2").tobytes()).hexdigest()


def stored_samples(wav: torch.Tensor) -> torch.Tensor:
    """``wav`` as the store gives it back (written as 16-bit PCM with 32767 scaling, read by libsndfile as
    int / 32768): features computed from this are the ones a later recomputation from the stored audio gives."""
    return torch.round(wav.clamp(-1.0, 1.0) * 32767.0) / 32768.0


def tensor_bytes(tensors: dict[str, torch.Tensor], voice_id: str, model_key: str) -> bytes:
    """Prompt features as safetensors bytes (each tensor copied to its own contiguous CPU storage)."""
    from safetensors.torch import save

    if not tensors or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()):
        raise InputError("features are a non-empty dict of name -> tensor")
    return save({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()},
                metadata={"voice_id": voice_id, "model_key": model_key})


@dataclass(frozen=True)
class VoiceRecord:
    """A saved voice (without its audio; read that with ``VoiceStore.audio``). Times are Unix seconds (UTC)."""

    id: str
    name: str
    transcript: str | None
    consent: str
    consent_at: float
    created_at: float
    sample_rate: int
    num_samples: int
    family: str = DEFAULT_FAMILY  # the model family it was made for (``cadenza.api.model_family`` names)
    cloning: str | None = None  # VoxCPM 2: "reference", "continuation" or "combined"
    declared_by: str | None = None  # who declared the right to use the voice (the consent record)
    audio_sha256: str | None = None  # SHA-256 of the recording's 16-bit samples as stored
    audio_kept: bool = True  # the recording itself is stored (else only the features synthesis needs)
    audio_expires_at: float | None = None  # when a kept recording is dropped (None: kept until the voice is)

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate

    def to_dict(self) -> dict:
        return {**asdict(self), "duration": round(self.duration, 3)}
