"""Pitch-preserving time-scale modification of a waveform, streamed: a phase vocoder with identity phase locking.

The speaking rate of both families is changed on the audio by default, by this to speed up (``audio/time_scale.py``;
docs/controls.md, "Speed"). A phase vocoder (Flanagan & Golden 1966; Laroche & Dolson 1999 for the phase locking)
reads short-time spectra every ``speed * hop`` samples and writes them every ``hop`` samples; each bin's phase is
advanced by its measured instantaneous frequency times the output hop, so sinusoids continue smoothly at their own
pitch. *Identity phase locking* keeps the bins around each spectral peak in the phase relation they had in the input
(each bin takes its peak's phase advance), which keeps a voice from sounding phasey or distant.

Unlike WSOLA (``audio/wsola.py``), which cuts the waveform into frames placed where they continue the previous one
best, nothing here depends on finding a waveform match: on a breathy voice, whose noise between the harmonics
defeats the match, speeding up keeps more words and sounds more natural (docs/controls.md: cadenza-tiny, 210
renderings, Whisper WER 0.103 -> 0.087 at 1.5x and 0.172 -> 0.150 at 2x). Slowed down it sounds phasey and loses a
few words WSOLA keeps.

``PhaseVocoder`` takes the audio in chunks of any size and returns what is final: an output sample is final once
every frame that overlaps it is added, so the output lags the input by about one frame (``lookahead_samples``,
48-53 ms) and the first chunk comes as early as the model's own. Pushing the whole signal at once gives the same
samples as pushing it in pieces.
"""

from __future__ import annotations

import math

import numpy as np

from cadenza.audio.speed_range import speed_in_range

# Analysis window: 1024 samples at 24 kHz, four periods of a 94 Hz voice, so its harmonics are resolved (with 21 ms a
# low male voice's pitch read 16 % high at half speed and a ~100 Hz voice's an octave up); 53 ms lost more words.
FRAME_S = 0.0427
OVERLAP = 8  # frames per window length: the output hop is an eighth of the frame (a quarter lost more words at 2x)


def _principal(phase: np.ndarray) -> np.ndarray:
    """Phase wrapped to [-pi, pi)."""
    return phase - 2.0 * np.pi * np.floor((phase + np.pi) / (2.0 * np.pi))


class PhaseVocoder:
    """Streaming phase vocoder of float mono audio at ``sample_rate`` by ``1 / speed`` in time; one per stream.

    ``push(chunk)`` returns the output samples that are final now; ``finish()`` the rest. All outputs together have
    ``round(n_in / speed)`` samples; input sample ``t`` lands near output sample ``t / speed``.
    """

    def __init__(self, speed: float, sample_rate: int) -> None:
        self.speed = speed_in_range(speed)
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        self.hop = max(1, int(round(FRAME_S * sample_rate / OVERLAP)))  # output hop
        self.frame = OVERLAP * self.hop
        n = np.arange(self.frame)
        self.window = 0.5 - 0.5 * np.cos(2.0 * np.pi * n / self.frame)  # periodic Hann
        # Squared windows a hop apart sum to a constant (3 / 8 of OVERLAP): the output gain.
        self.gain = float(np.sum(self.window ** 2) / self.hop)
        self.omega = 2.0 * np.pi * np.arange(self.frame // 2 + 1) / self.frame  # radians per sample, per bin
        # Input seen as ``frame`` zeros followed by the audio; frame ``k`` reads padded ``[pos_k, pos_k + frame)``,
        # pos_k = round(k * speed * hop), and is written at output ``k * hop``. Its centre, audio time
        # ``pos_k + frame / 2 - frame``, lands at output ``k * hop + frame / 2``; dropping the first ``offset`` output
        # samples puts audio time t at output t / speed.
        self.offset = int(round(self.frame / 2 + self.frame / (2 * self.speed)))
        self._x = np.zeros(self.frame, np.float64)  # padded input [x_base, x_base + len)
        self._x_base = 0
        self._n_in = 0
        self._y = np.zeros(0, np.float64)  # output accumulator from y_base on
        self._y_base = 0
        self._k = 0  # next frame
        self._prev_pos = 0
        self._prev_phase: np.ndarray | None = None  # analysis phase of frame k - 1
        self._out_phase: np.ndarray | None = None  # synthesis phase of frame k - 1
        self._emitted = 0  # output samples dealt with (padded output coordinates; the first ``offset`` are dropped)
        self._finished = False

    @property
    def lookahead_samples(self) -> int:
        """Input samples past an output sample's source needed before it is final (about one frame)."""
        return self.frame + int(math.ceil(self.speed * self.hop))

    def _position(self, k: int) -> int:
        return int(round(k * self.speed * self.hop))

    def _segment(self, start: int) -> np.ndarray:
        """Padded input ``[start, start + frame)`` (zeros past what was received: only at the end)."""
        i = start - self._x_base
        out = self._x[i: i + self.frame]
        if out.size < self.frame:
            out = np.concatenate([out, np.zeros(self.frame - out.size)])
        return out

    def _frame(self, k: int) -> np.ndarray:
        """Frame ``k``'s windowed output samples (to add at output ``k * hop``)."""
        pos = self._position(k)
        spectrum = np.fft.rfft(self._segment(pos) * self.window)
        magnitude, phase = np.abs(spectrum), np.angle(spectrum)
        if self._out_phase is None:
            out_phase = phase
        else:
            step = pos - self._prev_pos  # this frame's analysis hop (speed * hop, rounded)
            if step > 0:
                deviation = _principal(phase - self._prev_phase - self.omega * step)
                frequency = self.omega + deviation / step
            else:
                frequency = self.omega
            # Wrapped, so that the running phase of an hours-long stream keeps its precision.
            advanced = _principal(self._out_phase + frequency * self.hop)
            out_phase = self._lock(magnitude, phase, advanced)
        self._prev_pos, self._prev_phase, self._out_phase = pos, phase, out_phase
        return np.fft.irfft(magnitude * np.exp(1j * out_phase), self.frame) * self.window

    @staticmethod
    def _lock(magnitude: np.ndarray, phase: np.ndarray, advanced: np.ndarray) -> np.ndarray:
        """Identity phase locking: every bin keeps its input phase relative to the peak of its region (bins up to
        half-way to the neighbouring peaks) and takes that peak's advanced phase."""
        inner = magnitude[1:-1]
        peaks = np.flatnonzero((inner > magnitude[:-2]) & (inner >= magnitude[2:])) + 1
        if peaks.size == 0:
            return advanced
        bounds = (peaks[:-1] + peaks[1:]) // 2 + 1  # first bin of each region after the first
        owner = peaks[np.searchsorted(bounds, np.arange(magnitude.size), side="right")]
        return advanced[owner] + (phase - phase[owner])

    def _run(self, available: int) -> None:
        """Add every frame whose input (padded coordinates) lies before ``available``."""
        last = self._k
        while self._position(last) + self.frame <= available:
            last += 1
        if last == self._k:
            return
        need = (last - 1) * self.hop + self.frame - self._y_base  # the output the new frames reach, grown once
        if need > self._y.size:
            self._y = np.concatenate([self._y, np.zeros(need - self._y.size)])
        while self._k < last:
            start = self._k * self.hop - self._y_base
            self._y[start: start + self.frame] += self._frame(self._k)
            self._k += 1
            keep = self._position(self._k)  # input before the next frame's read is no longer needed
            if keep > self._x_base:
                self._x = self._x[keep - self._x_base:]
                self._x_base = keep

    def _take(self, stop: int) -> np.ndarray:
        """Output samples (padded coordinates) ``[emitted, stop)``, without the first ``offset``."""
        start = max(self._emitted, self.offset)
        stop = max(stop, self._emitted)
        out = (self._y[start - self._y_base: stop - self._y_base] / self.gain).astype(np.float32)  # empty if stop <= start
        self._emitted = stop
        self._y, self._y_base = self._y[stop - self._y_base:], stop
        return out

    def push(self, chunk: np.ndarray) -> np.ndarray:
        """chunk: float mono samples -> float32 output samples final now (possibly none)."""
        if self._finished:
            raise ValueError("this PhaseVocoder is finished")
        chunk = np.asarray(chunk, np.float64).reshape(-1)
        self._x = np.concatenate([self._x, chunk])
        self._n_in += chunk.size
        self._run(self.frame + self._n_in)
        # Output before frame k's start has every frame that overlaps it (frames k and later start at k * hop).
        return self._take(self._k * self.hop)

    def finish(self) -> np.ndarray:
        """The rest of the output (the input seen as followed by silence)."""
        self._finished = True
        total = self.offset + int(round(self._n_in / self.speed))  # padded output coordinates
        while self._k * self.hop < total:  # past the end of the input, frames read silence
            self._run(self._position(self._k) + self.frame)
        return self._take(total)
