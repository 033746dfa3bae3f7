"""16-bit PCM bytes and WAV headers written by hand, for audio that leaves while it is made (a pipe, an HTTP body).

A streamed WAV uses the usual convention for an unknown length (RIFF and data sizes 0xFFFFFFFF, "until the end of
the stream"), which players reading a pipe (aplay, ffplay, sox) and libsndfile accept; when the total length is
known up front the sizes are exact.
"""

from __future__ import annotations

import struct

import numpy as np

STREAMING_SIZE = 0xFFFFFFFF


def int16_samples(samples: np.ndarray) -> np.ndarray:
    """float [-1, 1] -> int16, clipped (never wrapped), with symmetric 32767 scaling so that +1 and -1 both map to
    full scale: the one conversion every 16-bit output of the package uses (files, streams, hashes)."""
    return np.round(np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767.0).astype(np.int16)


def pcm16(samples: np.ndarray) -> bytes:
    """float32 [-1, 1] -> 16-bit little-endian PCM bytes (``int16_samples``; NaN as silence)."""
    return int16_samples(np.nan_to_num(np.asarray(samples, dtype=np.float32))).astype("<i2").tobytes()


def wav_header(sample_rate: int, num_samples: int | None = None) -> bytes:
    """44-byte PCM16 mono WAV header; ``num_samples=None`` writes the streaming sizes (0xFFFFFFFF)."""
    data = STREAMING_SIZE if num_samples is None else 2 * num_samples
    riff = STREAMING_SIZE if num_samples is None else 36 + data
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate,
            2 * sample_rate, 2, 16) + b"data" + struct.pack("<I", data))
