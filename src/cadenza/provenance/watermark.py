"""Provenance watermark: an inaudible keyed mark with a 32-bit payload in generated audio, and its detector.

``Watermark(key, sample_rate)`` holds the validated configuration. ``embedder(payload)`` gives a
``StreamEmbedder`` for one output (push chunks, same length out, no delay); ``embed(audio, payload)`` marks a
whole signal (the same samples as pushing it in any chunks); ``detect(audio, sample_rate)`` reads a mark back
from audio at any rate, cropped anywhere, at least 0.5 s long. How it works, what it survives and what it costs:
docs/provenance.md.

The mark is additive spread spectrum: a keyed 0.48 s cycle of 1-7 kHz cells (``carrier.py``), repeated from
sample 0 of the output, in six bands whose levels follow the audio's own band levels (``strength`` below them), as
measured on the previous 20 ms block. Using only past samples is what keeps the embedder delay-free and
chunk-independent: each output sample is the input sample plus the carrier at its absolute position times gains
fixed by earlier, complete blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from cadenza.errors import AudioError, InputError
from cadenza.provenance import carrier, detector, payload
from cadenza.provenance.carrier import CellLayout

MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 16_000, 192_000  # embedding: the carrier reaches 7 kHz
MIN_DETECT_RATE = 8_000
DEFAULT_STRENGTH = 0.14  # mark amplitude / audio amplitude in each band (-17 dB there)
DEFAULT_MIN_SNR_DB = 31.0  # and never louder than this below the audio's whole-band level (bright voices, fricatives)
DEFAULT_THRESHOLD = 6.0  # pilot score for "found"; docs/provenance.md measures the false-positive rate it gives
CRC_THRESHOLD = 4.5  # a lower score suffices when the payload's CRC also matches (1 in 65536 by chance)
# Gain bands (Hz): the mark's spectrum follows the audio's in these steps.
GAIN_BANDS = ((1000, 1500), (1500, 2000), (2000, 3000), (3000, 4000), (4000, 5500), (5500, 7000))


def _check_rate(sample_rate, what: str, low: int, high: int) -> int:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)):
        raise InputError(f"{what} must be an int (Hz), got {type(sample_rate).__name__} {sample_rate!r}")
    if not low <= int(sample_rate) <= high:
        raise InputError(f"{what} must be {low}-{high} Hz, got {sample_rate}")
    return int(sample_rate)


def _check_audio(audio, what: str, allow_empty: bool) -> np.ndarray:
    """``[n]`` float array (or tensor) -> float32 ``[n]``; a clear ``AudioError`` for anything else."""
    if isinstance(audio, torch.Tensor):
        audio = audio.detach().cpu().numpy()
    if not isinstance(audio, np.ndarray):
        raise AudioError(f"{what} must be a numpy array of float samples, got {type(audio).__name__}")
    if audio.ndim != 1:
        raise AudioError(f"{what} must be mono, shape [samples]; got shape {audio.shape}")
    if not np.issubdtype(audio.dtype, np.floating):
        raise AudioError(f"{what} must hold float samples in [-1, 1], got dtype {audio.dtype}")
    if audio.size == 0 and not allow_empty:
        raise AudioError(f"{what} is empty")
    audio = audio.astype(np.float32, copy=False)
    if not np.isfinite(audio).all():
        raise AudioError(f"{what} contains NaN or infinite samples")
    return audio


@dataclass(frozen=True)
class Detection:
    """What ``Watermark.detect`` found.

    ``found``: the audio carries this key's mark. ``payload``: the 32-bit payload when it was read with a matching
    CRC, else ``None``. ``score``: the pilot's peak in robust standard deviations (about 0-5 on unmarked audio,
    tens on marked audio). ``raw_payload``: the payload bits as read, CRC or not (for measuring bit accuracy).
    """

    found: bool
    payload: int | None
    score: float
    raw_payload: int

    def to_json(self) -> dict:
        return {"found": self.found, "payload": None if self.payload is None else f"{self.payload:08x}",
                "score": round(self.score, 2)}


@dataclass(frozen=True)
class Watermark:
    """A validated watermark configuration.

    ``key``: secret or public bytes selecting the carrier (``keys.DEFAULT_KEY``: Cadenza's public key).
    ``sample_rate``: the rate of the audio to mark (16-192 kHz, a multiple of 50 Hz). ``strength``: the mark's
    amplitude relative to the audio's in each band, in (0, 0.5]. ``min_snr_db``: the mark's power stays at least
    this far below the audio's whole-band power (per 20 ms block), in [10, 80]. ``threshold``: the pilot score
    above which ``detect`` reports ``found``.
    """

    key: bytes
    sample_rate: int
    strength: float = DEFAULT_STRENGTH
    min_snr_db: float = DEFAULT_MIN_SNR_DB
    threshold: float = DEFAULT_THRESHOLD
    _layout: CellLayout = field(init=False, repr=False, compare=False)
    _templates: detector.Templates = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.key, (bytes, bytearray)) or len(self.key) == 0:
            raise InputError(f"key must be non-empty bytes, got {type(self.key).__name__}")
        rate = _check_rate(self.sample_rate, "sample_rate", MIN_SAMPLE_RATE, MAX_SAMPLE_RATE)
        if rate % 50:
            raise InputError(f"sample_rate must be a multiple of 50 Hz (20 ms in whole samples), got {rate}")
        for name, value, low, high in (("strength", self.strength, 0.0, 0.5), ("min_snr_db", self.min_snr_db, 10, 80),
                                       ("threshold", self.threshold, 0.0, 1e6)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low < value <= high:
                raise InputError(f"{name} must be a finite number in ({low}, {high}], got {value!r}")
        object.__setattr__(self, "key", bytes(self.key))
        object.__setattr__(self, "sample_rate", rate)
        layout = CellLayout.from_key(self.key, payload.CODED_BITS)
        object.__setattr__(self, "_layout", layout)
        object.__setattr__(self, "_templates", detector.Templates.from_layout(layout))

    def embedder(self, payload_value: int) -> StreamEmbedder:
        """A fresh ``StreamEmbedder`` for one output carrying ``payload_value`` (an int in [0, 2**32))."""
        return StreamEmbedder(self, payload_value)

    def embed(self, audio: np.ndarray, payload_value: int) -> np.ndarray:
        """Mark a whole signal: float ``[n]`` at ``sample_rate`` -> float32 ``[n]`` (same as streaming it)."""
        audio = _check_audio(audio, "audio", allow_empty=False)
        stream = self.embedder(payload_value)
        return np.concatenate([stream.push(audio), stream.finish()])

    def detect(self, audio: np.ndarray, sample_rate: int) -> Detection:
        """Look for this key's mark in float ``[n]`` audio at ``sample_rate`` (8-192 kHz; resampled to 16 kHz).

        Works on any crop of at least 0.5 s (one full cycle); shorter audio is read as far as it goes.
        """
        from cadenza.audio.resample import resample

        rate = _check_rate(sample_rate, "sample_rate", MIN_DETECT_RATE, MAX_SAMPLE_RATE)
        audio = _check_audio(audio, "audio", allow_empty=False)
        x = resample(torch.from_numpy(audio), rate, detector.DETECT_RATE).numpy().astype(np.float64)
        reading = detector.read(x, self._templates)
        raw, crc_ok = payload.decode(reading.soft_bits)
        found = reading.score >= self.threshold or (crc_ok and reading.score >= CRC_THRESHOLD)
        value = raw
        if not crc_ok and reading.score >= self.threshold:  # the pilot found it: try its weakest bits
            value, crc_ok = payload.decode_least_reliable(reading.soft_bits)
        return Detection(found=found, payload=value if found and crc_ok else None, score=reading.score,
                         raw_payload=raw)


class StreamEmbedder:
    """Marks one output chunk by chunk: ``push(chunk)`` returns the chunk marked, same length, at once.

    The output equals ``Watermark.embed`` of the whole signal for any chunking. ``finish()`` ends the stream
    (there is nothing held back: it returns an empty array). Not thread-safe: one producer per embedder.
    """

    def __init__(self, watermark: Watermark, payload_value: int) -> None:
        self.watermark = watermark
        self.payload = payload.check_payload(payload_value)
        rate = watermark.sample_rate
        self._hop = carrier.samples_per_hop(rate)
        layout = watermark._layout
        signs = np.where(layout.pilot, 1.0, 0.0)
        data = layout.bit >= 0
        signs[data] = payload.encode(self.payload)[layout.bit[data]]
        # One unit-power carrier per gain band: [bands, cycle] at the output rate.
        cell_hz = carrier.BINS * carrier.BIN_HZ
        block_hz = np.fft.rfftfreq(self._hop, 1.0 / rate)
        carriers, masks = [], []
        for low, high in GAIN_BANDS:
            in_band = (cell_hz >= low) & (cell_hz < high) if high < carrier.HIGH_HZ else (cell_hz >= low)
            wave = carrier.synthesize(signs * in_band, layout, rate)
            carriers.append(wave / np.sqrt(np.mean(wave**2)))
            masks.append((block_hz >= low) & (block_hz < high))
        self._carriers = np.stack(carriers)
        self._masks = np.stack(masks)  # [bands, hop // 2 + 1] FFT bins of one 20 ms block per band
        self._window = np.sin(np.pi * np.arange(self._hop) / self._hop) ** 2
        # Mean power per sample in a band = 2 * sum |X_k|^2 / (n * sum w^2) for a Hann-windowed block.
        self._power_scale = 2.0 / (self._hop * np.sum(self._window**2))
        self._max_mark_power = 10.0 ** (-watermark.min_snr_db / 10.0)  # relative to the block's mean power
        self._pos = 0  # absolute index of the next input sample
        self._block = np.zeros(self._hop, dtype=np.float32)  # the current block's input so far
        self._gain_from = np.zeros(len(GAIN_BANDS))  # gains at the start and the end of the current block
        self._gain_to = np.zeros(len(GAIN_BANDS))
        self._finished = False

    def _block_gains(self, block: np.ndarray) -> np.ndarray:
        """Gains ``[bands]`` that put the mark ``strength`` below this complete block's band levels, and its total
        power ``min_snr_db`` below the block's."""
        spectrum = np.fft.rfft(block.astype(np.float64) * self._window)
        bin_power = np.abs(spectrum) ** 2 * self._power_scale
        gains_sq = self.watermark.strength**2 * (self._masks @ bin_power)  # carriers have unit power
        limit = self._max_mark_power * bin_power.sum()  # the scale makes the bins add up to the mean power
        total = gains_sq.sum()
        if total > limit:
            gains_sq *= limit / total
        return np.sqrt(gains_sq)

    def push(self, chunk: np.ndarray) -> np.ndarray:
        """Mark float ``[n]`` samples (the next ones of this output) -> float32 ``[n]``."""
        if self._finished:
            raise RuntimeError("push() after finish(): this StreamEmbedder's output is complete")
        x = _check_audio(chunk, "chunk", allow_empty=True)
        out = np.empty(x.size, dtype=np.float32)
        done = 0
        while done < x.size:
            offset = self._pos % self._hop
            take = min(self._hop - offset, x.size - done)
            part = x[done: done + take]
            # Gains ramp linearly across the block; elementwise, so any chunking gives the same samples.
            ramp = (offset + np.arange(take)) / self._hop
            idx = (self._pos + np.arange(take)) % self._carriers.shape[1]
            mark = np.zeros(take)
            for band in range(len(GAIN_BANDS)):
                gain = self._gain_from[band] + (self._gain_to[band] - self._gain_from[band]) * ramp
                mark += gain * self._carriers[band, idx]
            out[done: done + take] = part + mark
            self._block[offset: offset + take] = part
            self._pos += take
            done += take
            if offset + take == self._hop:  # block complete: its levels set the next block's end gains
                self._gain_from, self._gain_to = self._gain_to, self._block_gains(self._block)
        return out

    def finish(self) -> np.ndarray:
        """End the stream; returns the held-back samples (none: the embedder has no delay), float32 ``[0]``."""
        self._finished = True
        return np.zeros(0, dtype=np.float32)
