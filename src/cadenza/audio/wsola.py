"""Pitch-preserving time-scale modification of a waveform, streamed: WSOLA (waveform-similarity overlap-add).

One of the two ways ``audio/time_scale.py`` changes the speaking rate on the audio (docs/controls.md, "Speed"): the
default to slow down (the phase vocoder keeps more words to speed up), and the training-time voice augmentation's.
WSOLA (Verhelst & Roelands, 1993) cuts the input into Hann-windowed frames read every ``speed * hop`` samples and
overlap-adds them every ``hop`` samples; each frame's read position is moved by up to ``tolerance`` so that it
continues the previous frame's waveform best (highest normalised cross-correlation with the samples that naturally
followed it), which keeps the pitch periods whole: the duration changes by ``1 / speed``, the pitch does not.

``Wsola`` takes the audio in chunks of any size and returns what is final: a frame needs its input up to
``frame + tolerance`` samples past its read position, so the output lags the input by a bounded look-ahead
(``lookahead_samples``, ~50 ms) and the first chunk comes as early as the model's own. Pushing the whole signal at
once gives the same samples as pushing it in pieces.
"""

from __future__ import annotations

import math

import numpy as np

from cadenza.audio.speed_range import speed_in_range

FRAME_S = 0.030  # analysis window: a few pitch periods of speech
TOLERANCE_S = 0.010  # how far a frame may move to line up with the previous one (> one period at 100 Hz)


class Wsola:
    """Streaming WSOLA of float32 mono audio at ``sample_rate`` by ``1 / speed`` in time; one per stream.

    ``push(chunk)`` returns the output samples that are final now; ``finish()`` the rest. All outputs together have
    ``round(n_in / speed)`` samples.
    """

    def __init__(self, speed: float, sample_rate: int) -> None:
        self.speed = speed_in_range(speed)
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        self.hop = max(2, int(round(FRAME_S * sample_rate / 2)))  # synthesis hop (half a frame)
        self.frame = 2 * self.hop
        self.tolerance = max(1, int(round(TOLERANCE_S * sample_rate)))
        # Periodic Hann: windows a hop apart sum to exactly 1.
        self.window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(self.frame) / self.frame)).astype(np.float64)
        # The input is seen as ``hop`` zeros followed by the audio, and the first ``hop`` output samples are
        # dropped, so that input sample ``k * speed * hop`` lands on output sample ``k * hop`` and the signal
        # starts at full gain.
        self._x = np.zeros(self.hop, np.float64)  # input [x_base, x_base + len)
        self._x_base = 0
        self._n_in = 0  # real input samples received
        self._y = np.zeros(self.frame, np.float64)  # output accumulator from y_base on
        self._y_base = 0
        self._k = 0  # next synthesis frame
        self._prev = 0  # read position of the previous frame (padded input coordinates)
        self._emitted = 0  # output samples returned, padded coordinates (the first ``hop`` are never returned)
        self._finished = False

    @property
    def lookahead_samples(self) -> int:
        """Input samples past a frame's read position it needs (its length plus the search range)."""
        return self.frame + self.tolerance + int(math.ceil(max(self.speed, 1.0) * self.hop))

    def _input(self, start: int, n: int) -> np.ndarray:
        """Padded-input samples ``[start, start + n)`` (zeros past the end)."""
        i = start - self._x_base
        out = self._x[max(i, 0): i + n]
        if i < 0:
            out = np.concatenate([np.zeros(-i), out])
        if out.size < n:
            out = np.concatenate([out, np.zeros(n - out.size)])
        return out

    def _position(self, k: int) -> int:
        """Read position of frame ``k``: nominal ``k * speed * hop``, moved to continue frame ``k - 1`` best."""
        nominal = int(round(k * self.speed * self.hop))
        if k == 0:
            return nominal
        lo = max(0, nominal - self.tolerance)
        hi = nominal + self.tolerance
        target = self._input(self._prev + self.hop, self.frame)  # what naturally followed the previous frame
        region = self._input(lo, hi - lo + self.frame)
        n = region.size + target.size - 1
        size = 1 << (n - 1).bit_length()
        corr = np.fft.irfft(np.fft.rfft(region, size) * np.conj(np.fft.rfft(target, size)), size)[: hi - lo + 1]
        energy = np.cumsum(np.concatenate([[0.0], region * region]))
        energy = energy[self.frame:] - energy[: energy.size - self.frame]
        score = corr / np.sqrt(np.maximum(energy[: corr.size], 1e-12))
        if not np.any(energy[: corr.size] > 1e-10):
            return nominal  # silence: nothing to line up
        return lo + int(np.argmax(score))

    def _needs(self, k: int) -> int:
        """Padded input samples frame ``k`` reads: its search region and (below speed 1 reaching further) the
        samples that followed the previous frame."""
        nominal = int(round(k * self.speed * self.hop))
        follow = self._prev + self.hop + self.frame if k else 0
        return max(nominal + self.tolerance + self.frame, follow)

    def _run(self, available: int) -> None:
        """Add every frame whose input (padded coordinates) lies before ``available``."""
        while True:
            if self._needs(self._k) > available:
                return
            pos = self._position(self._k)
            start = self._k * self.hop - self._y_base
            if start + self.frame > self._y.size:
                self._y = np.concatenate([self._y, np.zeros(start + self.frame - self._y.size)])
            self._y[start: start + self.frame] += self._input(pos, self.frame) * self.window
            self._prev = pos
            self._k += 1
            # Input before the next frame's earliest read (and its template) is no longer needed.
            keep = min(self._prev + self.hop, int(round(self._k * self.speed * self.hop)) - self.tolerance)
            if keep > self._x_base:
                self._x = self._x[keep - self._x_base:]
                self._x_base = keep

    def _take(self, stop: int) -> np.ndarray:
        """Output samples (padded coordinates) ``[emitted, stop)``, without the first ``hop``."""
        start = max(self._emitted, self.hop)
        if stop <= start:
            return np.zeros(0, np.float32)
        out = self._y[start - self._y_base: stop - self._y_base].astype(np.float32)
        self._emitted = stop
        drop = stop - self._y_base
        self._y, self._y_base = self._y[drop:], stop
        return out

    def push(self, chunk: np.ndarray) -> np.ndarray:
        """chunk: float mono samples -> float32 output samples final now (possibly none)."""
        if self._finished:
            raise ValueError("this Wsola is finished")
        chunk = np.asarray(chunk, np.float64).reshape(-1)
        self._x = np.concatenate([self._x, chunk])
        self._n_in += chunk.size
        self._run(self.hop + self._n_in)
        # Output before frame k's start has all its frames (frames k-1 and earlier) added.
        return self._take(self._k * self.hop)

    def finish(self) -> np.ndarray:
        """The rest of the output (the input seen as followed by silence)."""
        self._finished = True
        total = self.hop + int(round(self._n_in / self.speed))  # padded output coordinates
        # Frames up to the one starting at or after ``total`` cover every output sample before it.
        last = total // self.hop + 1
        while self._k <= last:  # past the end of the input, every frame reads silence
            self._run(self._needs(self._k))
        return self._take(total)
