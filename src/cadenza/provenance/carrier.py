"""The keyed carrier: one cycle of the watermark waveform, defined in seconds and hertz so that every sample rate
gets the same continuous signal (docs/provenance.md, "How it works").

A cycle is ``FRAMES`` overlapping frames (``FRAME_S`` long, ``HOP_S`` apart, Hann window) on a circle of
``CYCLE_S`` seconds. Frame ``j`` holds one windowed cosine per bin ``k`` (``1 / FRAME_S`` = 25 Hz apart) between
``LOW_HZ`` and ``HIGH_HZ``, with a keyed phase: a *cell*. Half of the cells, on a keyed checkerboard, are *pilot*
cells (sign +1 always: the detector finds the cycle's position from them without knowing the payload); the other
half carry the coded payload, each bit on ``cells / bits`` cells spread over the whole cycle. Cells are critically
sampled (about ``2 * bandwidth * CYCLE_S`` of them), so with random phases they are close to orthogonal.

The phases and the layout come from SHAKE-256 of the key, never from NumPy's generators, whose streams may change
between NumPy versions: a mark made today must still be read by a later release.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

HOP_S = 0.02  # frame hop; every supported rate has a whole number of samples in it (rate % 50 == 0)
FRAME_S = 2 * HOP_S  # Hann frames overlapping by half
FRAMES = 24  # frames per cycle: the cycle (0.48 s) fits in any 0.5 s crop
CYCLE_S = FRAMES * HOP_S
LOW_HZ, HIGH_HZ = 1000.0, 7000.0  # above most of speech's energy (cheap in SNR); below a 16 kHz resampler's cut-off
BIN_HZ = 1.0 / FRAME_S
BINS = np.arange(round(LOW_HZ / BIN_HZ), round(HIGH_HZ / BIN_HZ) + 1)  # [bins] carrier bins (25 Hz grid)
_DOMAIN = b"cadenza-watermark-v1"


def _keyed_bytes(key: bytes, label: bytes, n: int) -> np.ndarray:
    """``n`` keyed pseudo-random bytes (uint8 ``[n]``); the same forever for the same key and label."""
    return np.frombuffer(hashlib.shake_256(_DOMAIN + b"|" + label + b"|" + key).digest(n), dtype=np.uint8)


@dataclass(frozen=True)
class CellLayout:
    """Where each cell of a cycle goes. All arrays are ``[FRAMES, bins]``.

    ``phase``: keyed phase in radians. ``pilot``: True for pilot cells. ``bit``: index of the coded bit a data
    cell carries (``-1`` for pilot cells).
    """

    phase: np.ndarray
    pilot: np.ndarray
    bit: np.ndarray

    @classmethod
    def from_key(cls, key: bytes, coded_bits: int) -> CellLayout:
        shape = (FRAMES, BINS.size)
        cells = FRAMES * BINS.size
        # 16-bit phases: finer than any channel keeps.
        raw = _keyed_bytes(key, b"phase", 2 * cells).view("<u2").astype(np.float64)
        phase = (raw * (2 * np.pi / 65536.0)).reshape(shape)
        # Keyed checkerboard: neighbouring cells alternate, so pilots and data see the same channel everywhere.
        flip = _keyed_bytes(key, b"board", FRAMES) & 1
        pilot = ((np.arange(FRAMES)[:, None] + BINS[None, :] + flip[:, None]) % 2) == 0
        # Data cells take the coded bits in turn along a keyed permutation: every bit spread over the whole cycle.
        data_idx = np.flatnonzero(~pilot.ravel())
        order = np.argsort(_keyed_bytes(key, b"order", 4 * data_idx.size).view("<u4"), kind="stable")
        bit = np.full(cells, -1, dtype=np.int64)
        bit[data_idx[order]] = np.arange(data_idx.size) % coded_bits
        return cls(phase=phase, pilot=pilot, bit=bit.reshape(shape))


def samples_per_hop(sample_rate: int) -> int:
    """Samples in one hop (20 ms) at ``sample_rate``; the rate must be a multiple of 50 Hz."""
    hop = sample_rate * HOP_S
    if abs(hop - round(hop)) > 1e-9:
        raise ValueError(f"sample rate {sample_rate} Hz has no whole number of samples in {HOP_S * 1000:.0f} ms")
    return round(hop)


def synthesize(amplitudes: np.ndarray, layout: CellLayout, sample_rate: int) -> np.ndarray:
    """One cycle from per-cell signed amplitudes ``[FRAMES, bins]`` -> float64 ``[FRAMES * hop]`` at ``sample_rate``.

    Each cell is ``amplitude * hann(t) * cos(2 pi f t + phase)`` over its frame, added around the circle.
    """
    hop = samples_per_hop(sample_rate)
    n = 2 * hop
    if BINS[-1] >= hop:  # bin index hop is the Nyquist frequency of an n-point frame
        raise ValueError(f"sample rate {sample_rate} Hz is too low for a carrier up to {HIGH_HZ:.0f} Hz")
    spectrum = np.zeros((FRAMES, hop + 1), dtype=np.complex128)
    spectrum[:, BINS] = amplitudes * np.exp(1j * layout.phase) * (n / 2)  # irfft of this: amplitude * cos(...)
    window = np.sin(np.pi * np.arange(n) / n) ** 2  # periodic Hann: the same continuous window at every rate
    frames = np.fft.irfft(spectrum, n=n, axis=1) * window
    cycle = np.zeros(FRAMES * hop)
    for j in range(FRAMES):  # frame j starts at hop j; the last one wraps around
        idx = (j * hop + np.arange(n)) % cycle.size
        np.add.at(cycle, idx, frames[j])
    return cycle


def frame_spectra(cycle: np.ndarray, sample_rate: int) -> np.ndarray:
    """Analysis matching ``synthesize``: ``[FRAMES * hop]`` -> complex ``[FRAMES, bins]``, the inner products of the
    (circular) cycle with each frame's Hann-windowed complex exponentials."""
    hop = samples_per_hop(sample_rate)
    n = 2 * hop
    window = np.sin(np.pi * np.arange(n) / n) ** 2
    idx = (np.arange(FRAMES)[:, None] * hop + np.arange(n)[None, :]) % cycle.size
    return np.fft.rfft(cycle[idx] * window, axis=1)[:, BINS]
