"""What marked audio goes through on its way to a detector: lossy codecs, resampling, crops, noise.

Used by ``benchmarks/watermark_robustness.py`` and the tests to measure what the mark survives
(docs/provenance.md). Every function takes and returns float32 mono ``[n]`` (with its rate where it changes).
Codecs go through PyAV (the ``server`` extra), as the server's own encoders do (``cadenza.server.encoding``).
"""

from __future__ import annotations

import io

import numpy as np
import torch

from cadenza.audio.resample import resample
from cadenza.audio.wav_stream import int16_samples

_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # libopus encodes only at these rates
_CODECS = {"mp3": ("mp3", "libmp3lame"), "opus": ("ogg", "libopus")}


def codec_roundtrip(audio: np.ndarray, sample_rate: int, codec: str, bit_rate: int = 64_000) -> tuple[np.ndarray, int]:
    """Encode float32 ``[n]`` with ``codec`` (``"mp3"`` or ``"opus"``) at ``bit_rate`` and decode it again.

    Returns ``(audio [m], rate)``: the decoder's output as it comes (with the codec's delay and padding; Opus
    decodes at 48 kHz), which is what a detector is handed in practice.
    """
    import av

    muxer, name = _CODECS[codec]
    rate = sample_rate
    if name == "libopus" and rate not in _OPUS_RATES:
        rate = next((r for r in _OPUS_RATES if r >= rate), _OPUS_RATES[-1])
        audio, sample_rate = resample_np(audio, sample_rate, rate), rate
    sink = io.BytesIO()
    with av.open(sink, mode="w", format=muxer) as container:
        stream = container.add_stream(name, rate=rate, layout="mono")
        stream.bit_rate = bit_rate
        pcm = int16_samples(audio)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = rate, 0
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    sink.seek(0)
    parts, out_rate = [], rate
    with av.open(sink, mode="r") as container:
        resampler = None
        for frame in container.decode(audio=0):
            out_rate = frame.sample_rate
            resampler = resampler or av.AudioResampler(format="flt", layout="mono", rate=out_rate)
            for converted in resampler.resample(frame):
                parts.append(converted.to_ndarray().reshape(-1))
    return np.concatenate(parts).astype(np.float32), out_rate


def resample_np(audio: np.ndarray, sample_rate: int, new_rate: int) -> np.ndarray:
    """float32 ``[n]`` at ``sample_rate`` -> float32 ``[m]`` at ``new_rate`` (soxr, as everywhere in Cadenza)."""
    return resample(torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)), sample_rate, new_rate).numpy()


def add_white_noise(audio: np.ndarray, snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """``audio`` plus white Gaussian noise ``snr_db`` below its mean power."""
    power = float(np.mean(audio.astype(np.float64) ** 2))
    noise = rng.standard_normal(audio.size) * np.sqrt(power * 10.0 ** (-snr_db / 10.0))
    return (audio + noise).astype(np.float32)


def random_crop(audio: np.ndarray, length: int, rng: np.random.Generator) -> np.ndarray:
    """A ``length``-sample stretch of ``audio`` starting anywhere (the whole of it when shorter)."""
    if audio.size <= length:
        return audio
    start = int(rng.integers(0, audio.size - length + 1))
    return audio[start: start + length]
