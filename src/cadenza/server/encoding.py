"""Audio encoders for the speech endpoint: float32 chunks in, encoded bytes out, chunk by chunk.

``pcm`` (raw 16-bit little-endian mono) and ``wav`` are written by hand; ``mp3``, ``opus`` (in Ogg), ``aac`` (ADTS)
and ``flac`` go through PyAV (FFmpeg). Every encoder is a streaming one: ``encode(chunk)`` returns whatever bytes
are ready (possibly none: codecs work on fixed frames and have look-ahead), ``finish()`` flushes the rest.
An encoder is used by one thread at a time; an abandoned one (client gone) is simply dropped -- FFmpeg state is
freed with the object, never closed from another thread while a worker may still be encoding.

PyAV writes into a sink without ``seek``, so FFmpeg's muxers never go back to patch headers: the output is
playable while it is produced. PCM and WAV bytes come from ``cadenza.audio.wav_stream`` (streamed WAV: sizes
0xFFFFFFFF, "until the end of the stream"; exact when the total length is known up front).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from cadenza.audio.wav_stream import pcm16, wav_header

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav", "pcm": "audio/pcm"}
# format -> (FFmpeg muxer, codec, bit rate or None, muxer options). Bit rates suit 24 kHz mono speech.
_AV_FORMATS = {
    "mp3": ("mp3", "libmp3lame", 64_000, {}),
    # Ogg collects 1 s of packets per page by default; short pages keep the stream flowing.
    "opus": ("ogg", "libopus", 32_000, {"page_duration": "100000"}),
    "aac": ("adts", "aac", 64_000, {}),
    "flac": ("flac", "flac", None, {}),
}
# Opus encodes only at these rates; others are resampled by PyAV to the next one up.
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
class Encoder(Protocol):
    def encode(self, samples: np.ndarray) -> bytes: ...

    def finish(self) -> bytes: ...


class PcmEncoder:
    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate

    def encode(self, samples: np.ndarray) -> bytes:
        return pcm16(samples)

    def finish(self) -> bytes:
        return b""


class WavEncoder:
    """The header goes out with the first bytes; ``total_samples`` (if known) makes its sizes exact."""

    def __init__(self, sample_rate: int, total_samples: int | None = None) -> None:
        self.sample_rate, self._header = sample_rate, wav_header(sample_rate, total_samples)

    def encode(self, samples: np.ndarray) -> bytes:
        out, self._header = self._header + pcm16(samples), b""
        return out

    def finish(self) -> bytes:
        out, self._header = self._header, b""  # no audio at all: still a valid (empty) file
        return out


class _Sink:
    """A write-only file for PyAV: no ``seek``, so muxers stream instead of patching headers at the end."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class AVEncoder:
    """mp3 / opus / aac / flac through PyAV. Input float32 mono at ``sample_rate``."""

    def __init__(self, fmt: str, sample_rate: int, total_samples: int | None = None) -> None:
        self._total = total_samples if fmt == "flac" else None
        try:
            import av
        except ImportError as exc:  # pragma: no cover - av is part of the server extra
            from cadenza.errors import MissingDependencyError

            raise MissingDependencyError(f"the {fmt} format needs PyAV: pip install 'cadenza[server]'") from exc
        self._av = av
        muxer, codec, bit_rate, options = _AV_FORMATS[fmt]
        rate = sample_rate
        if codec == "libopus" and rate not in _OPUS_RATES:
            rate = next((r for r in _OPUS_RATES if r >= rate), _OPUS_RATES[-1])
        self.sample_rate = sample_rate
        self._sink = _Sink()
        self._container = av.open(self._sink, mode="w", format=muxer, options=dict(options))
        self._stream = self._container.add_stream(codec, rate=rate, layout="mono")
        if bit_rate:
            self._stream.bit_rate = bit_rate
        self._pts = 0
        self._closed = False

    def _mux(self, frame) -> bytes:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._sink.take()

    def encode(self, samples: np.ndarray) -> bytes:
        if np.asarray(samples).size == 0:
            return b""
        # 16-bit first, with our scaling: FLAC then holds exactly the samples of the pcm/wav formats.
        x = np.frombuffer(pcm16(samples), dtype="<i2").astype(np.int16)
        frame = self._av.AudioFrame.from_ndarray(x.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = self.sample_rate, self._pts
        self._pts += x.size
        out = self._mux(frame)
        if self._total is not None and out.startswith(b"fLaC"):
            out = _flac_with_length(out, self._total)
        return out

    def finish(self) -> bytes:
        if self._closed:
            return b""
        out = self._mux(None)
        self._container.close()
        self._closed = True
        return out + self._sink.take()


def _flac_with_length(data: bytes, total_samples: int) -> bytes:
    """FLAC bytes whose STREAMINFO says ``total_samples`` (FFmpeg writing to a pipe leaves 0, "unknown", which some
    readers take for an endless stream). STREAMINFO follows ``fLaC`` and its 4-byte block header; the 36-bit sample
    count is the low end of the big-endian 64-bit word at byte 18 (after rate, channels and bits per sample)."""
    if len(data) < 26 or data[4] & 0x7F != 0:  # not a STREAMINFO block first: leave as is
        return data
    word = int.from_bytes(data[18:26], "big")
    word = (word & ~((1 << 36) - 1)) | (total_samples & ((1 << 36) - 1))
    return data[:18] + word.to_bytes(8, "big") + data[26:]


def make_encoder(fmt: str, sample_rate: int, total_samples: int | None = None) -> Encoder:
    """An encoder for ``fmt`` (one of ``FORMATS``). ``total_samples``: the length, when known in advance (WAV and
    FLAC headers then carry it)."""
    if fmt == "pcm":
        return PcmEncoder(sample_rate)
    if fmt == "wav":
        return WavEncoder(sample_rate, total_samples)
    if fmt in _AV_FORMATS:
        return AVEncoder(fmt, sample_rate, total_samples)
    raise ValueError(f"unknown audio format {fmt!r}; supported: {', '.join(FORMATS)}")
