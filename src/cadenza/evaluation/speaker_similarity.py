"""Speaker similarity: cosine of Resemblyzer (GE2E, 256-d) utterance embeddings.

Resemblyzer's d-vector encoder (a 3-layer LSTM trained with the GE2E loss; its weights ship in the wheel) runs on
CPU. Audio is brought to 16 kHz mono here, then Resemblyzer's ``preprocess_wav`` normalises the loudness and
shortens silences (WebRTC VAD), and ``embed_utterance`` averages the embeddings of 1.6 s windows. The embeddings
are L2-normalised and non-negative, so the cosine lies in [0, 1].

Seed-TTS-eval reports SIM with a WavLM-large speaker-verification model; GE2E cosines are on a different scale
(same speaker typically 0.75-0.95, different speakers 0.4-0.75 on clean speech), so compare figures only with
figures from this same tool. Clips under ~2 s give noisy embeddings.
"""

from __future__ import annotations

import functools
import os
import warnings

import numpy as np
import torch

from cadenza.errors import AudioError, MissingDependencyError
from cadenza.evaluation.audio import EVAL_SR, load_16k, to_16k_mono

SIMILARITY_NAME = "resemblyzer GE2E cosine"
INSTALL_HINT = "pip install 'cadenza[eval]'"


def _resemblyzer():
    try:
        with warnings.catch_warnings():
            # webrtcvad imports pkg_resources and resemblyzer an old scipy path: warnings about them, not us
            warnings.simplefilter("ignore", category=UserWarning)
            warnings.simplefilter("ignore", category=DeprecationWarning)
            import resemblyzer
    except ImportError as exc:
        missing = "setuptools<81 (webrtcvad needs pkg_resources)" if exc.name == "pkg_resources" else exc.name
        raise MissingDependencyError(f"speaker similarity needs resemblyzer from the 'eval' extra ({missing} is "
                                     f"missing): {INSTALL_HINT}") from exc
    return resemblyzer


def load_encoder(device: str | torch.device = "cpu"):
    """The Resemblyzer ``VoiceEncoder``, loaded once per device."""
    return _load_encoder(str(device))


@functools.lru_cache(maxsize=2)
def _load_encoder(device: str):
    return _resemblyzer().VoiceEncoder(device, verbose=False)


def embed(wav: np.ndarray | torch.Tensor, sr: int, *, encoder=None) -> np.ndarray:
    """Speaker embedding of one utterance. ``wav``: ``[samples]`` (or ``[channels, samples]``) at ``sr`` Hz ->
    ``[256]`` float32, unit length. Raises ``AudioError`` if no speech is left after silence trimming."""
    audio = to_16k_mono(wav, sr)
    prepared = _resemblyzer().preprocess_wav(audio)  # already 16 kHz: no source_sr, so no librosa resampling
    if prepared.size == 0:
        raise AudioError("no speech found in the audio for the speaker embedding")
    encoder = encoder if encoder is not None else load_encoder()
    return np.asarray(encoder.embed_utterance(prepared), dtype=np.float32)


def embed_file(path: str | os.PathLike, *, encoder=None) -> np.ndarray:
    """``embed`` for an audio file (any format libsndfile reads)."""
    return embed(load_16k(path), EVAL_SR, encoder=encoder)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two embeddings ``[dim]``."""
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"embeddings differ in size: {a.shape[0]} vs {b.shape[0]}")
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norm == 0.0:
        raise ValueError("cannot compare a zero embedding")
    return float(a @ b) / norm


def similarity(wav_a: np.ndarray | torch.Tensor, sr_a: int, wav_b: np.ndarray | torch.Tensor, sr_b: int, *,
               encoder=None) -> float:
    """Cosine similarity of the speakers of two utterances."""
    return cosine(embed(wav_a, sr_a, encoder=encoder), embed(wav_b, sr_b, encoder=encoder))


__all__ = ["SIMILARITY_NAME", "cosine", "embed", "embed_file", "load_encoder", "similarity"]
