"""Reading a mark back: whiten, fold onto the cycle, find the pilot, read the payload (docs/provenance.md).

Everything runs at ``DETECT_RATE`` (16 kHz): the carrier lies below 7 kHz, so audio at any rate, resampled there,
still holds it. The steps:

1. Whiten: divide every STFT cell by the audio's own local magnitude. Speech is the noise here; after this, loud
   and quiet parts (and strong and weak bands) weigh alike, as the mark follows the speech's level.
2. Drop what repeats every 20 ms (``drop_hop_periodic``): a vocoder's frame-rate buzz or 50 Hz mains hum would
   otherwise fold as coherently as the mark (the cycle is 24 of those periods) and bias the payload bits.
3. Fold: add the whitened audio onto one cycle (``CYCLE_S``) modulo its length. The mark repeats every cycle, so
   its copies add up coherently wherever the crop started; the speech does not.
4. Pilot: circular cross-correlation with the pilot cells' waveform over every lag (an FFT). The peak's height in
   units of the correlation's own robust spread is the ``score``; its lag is where the crop started in the cycle.
5. Payload: at that lag (refined to a fraction of a sample), project onto each data cell and add the cells of each
   coded bit; signs -> bits -> CRC check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cadenza.provenance import carrier, payload
from cadenza.provenance.carrier import CellLayout

DETECT_RATE = 16_000
_N_FFT, _HOP = 512, 256  # whitening STFT: 32 ms sqrt-Hann frames, half overlap (perfect reconstruction)
_SQRT_HANN = np.sin(np.pi * np.arange(_N_FFT) / _N_FFT)
_FREQS = np.fft.rfftfreq(_N_FFT, 1.0 / DETECT_RATE)
_ENV_BINS = 4
_PERIODIC_SPAN = 6  # drop_hop_periodic's mean: +-6 periods (260 ms); fewer track a changing buzz, but cost more mark
_BAND = (_FREQS >= carrier.LOW_HZ - 50.0) & (_FREQS <= carrier.HIGH_HZ + 50.0)


@dataclass(frozen=True)
class Templates:
    """What the detector compares against, at ``DETECT_RATE``: the pilot waveform ``[cycle]`` and the layout."""

    pilot_spectrum: np.ndarray  # rfft of the pilot cycle, complex [cycle // 2 + 1]
    layout: CellLayout
    cycle: int  # samples per cycle at DETECT_RATE

    @classmethod
    def from_layout(cls, layout: CellLayout) -> Templates:
        pilot = carrier.synthesize(layout.pilot.astype(np.float64), layout, DETECT_RATE)
        return cls(pilot_spectrum=np.fft.rfft(pilot), layout=layout, cycle=pilot.size)


@dataclass(frozen=True)
class Reading:
    """The detector's raw findings: pilot ``score`` (robust z), where the cycle starts, and the soft coded bits."""

    score: float
    lag: float
    soft_bits: np.ndarray  # [CODED_BITS], positive: bit 1


def whiten(audio: np.ndarray) -> np.ndarray:
    """``[n]`` float at ``DETECT_RATE`` -> ``[n]`` float64, each STFT cell in the carrier band weighted for
    detection, the rest of the spectrum dropped.

    The mark in a cell is about ``strength`` times the audio's *envelope* there (it follows band levels), while
    the interference is the cell's own audio. The weight ``envelope / (|cell|^2 + envelope / 10)`` is then the
    matched filter's (mark over interference power), with a floor so that one near-empty cell cannot dominate.
    """
    n = audio.size
    frames = max(1, -(-(n + _N_FFT) // _HOP))
    padded = np.zeros((frames + 1) * _HOP + _N_FFT)
    padded[_N_FFT - _HOP: _N_FFT - _HOP + n] = audio  # frames fully cover the first and the last sample
    idx = np.arange(frames)[:, None] * _HOP + np.arange(_N_FFT)[None, :]
    spec = np.fft.rfft(padded[idx] * _SQRT_HANN, axis=1)
    spec[:, ~_BAND] = 0.0
    power = np.abs(spec) ** 2
    # Envelope: power averaged over +-4 bins (+-125 Hz) and +-1 frame.
    cumsum = np.cumsum(np.pad(power, ((0, 0), (_ENV_BINS + 1, _ENV_BINS))), axis=1)
    env = (cumsum[:, 2 * _ENV_BINS + 1:] - cumsum[:, : -2 * _ENV_BINS - 1]) / (2 * _ENV_BINS + 1)
    smooth = env.copy()
    smooth[1:] += env[:-1]
    smooth[:-1] += env[1:]
    env = smooth / 3.0
    floor = 1e-6 * power[:, _BAND].mean() + 1e-24  # digital silence and dither stay at about zero
    spec *= np.sqrt(env) / (power + 0.1 * env + floor)
    out = np.zeros_like(padded)
    np.add.at(out, idx, np.fft.irfft(spec, n=_N_FFT, axis=1) * _SQRT_HANN)
    return out[_N_FFT - _HOP: _N_FFT - _HOP + n]


def drop_hop_periodic(signal: np.ndarray, rate: int = DETECT_RATE) -> np.ndarray:
    """``[n]`` -> ``[n]``: the part of ``signal`` that repeats every 20 ms removed, as far as it exceeds chance.

    Why: anything that repeats every 20 ms also repeats every cycle (24 periods), so folding adds it up as
    coherently as the mark and biases the payload bits. Mains hum at 50 Hz does, and so does a small vocoder that
    voices partly at multiples of 50 Hz, locked to its 50 Hz mel frames: in cadenza-tiny's output about half of
    the whitened 1-7 kHz power repeats so, and the payload read back from 2 of 24 clips of 2.4-3.7 s (24 of 24 with
    this step; docs/provenance.md).

    How: per 20 ms period, the mean of the samples a whole number of periods away within ``_PERIODIC_SPAN``
    periods either side (fewer at the ends) estimates the repeating part. Even without any repetition that mean
    holds 1/count of the local power (the mark's share included), so it is subtracted with a Wiener gain, the
    repeating power's share of the mean's: 0 where the mean holds no more than chance (speech without a buzz
    keeps all of its mark), 1 for pure repetition. A comb, not notches at fixed frequencies: it works wherever a
    crop starts.
    """
    period = round(rate * carrier.HOP_S)
    n = signal.size
    rows = -(-n // period)
    grid = np.zeros(rows * period)
    grid[:n] = signal
    grid = grid.reshape(rows, period)
    present = (np.arange(rows * period) < n).astype(np.float64).reshape(rows, period)
    sums = np.vstack([np.zeros((1, period)), np.cumsum(grid, axis=0)])
    counts = np.vstack([np.zeros((1, period)), np.cumsum(present, axis=0)])
    row = np.arange(rows)
    low = np.clip(row - _PERIODIC_SPAN, 0, rows)
    high = np.clip(row + _PERIODIC_SPAN + 1, 0, rows)
    count = np.maximum(counts[high] - counts[low], 1.0)
    mean = (sums[high] - sums[low]) / count
    power = np.concatenate([[0.0], np.cumsum(np.mean(grid**2, axis=1))])
    local_power = (power[high] - power[low]) / np.maximum(high - low, 1)
    mean_power = np.mean(mean**2, axis=1) + 1e-30
    # mean_power = R + A / c and local_power = R + A (R repeating, A not, c samples averaged): solve for R.
    c = count.mean(axis=1)
    repeating = (mean_power * c - local_power) / np.maximum(c - 1.0, 1.0)
    gain = np.clip(repeating / mean_power, 0.0, 1.0)
    return (grid - gain[:, None] * mean * present).ravel()[:n]


def fold(signal: np.ndarray, cycle: int) -> np.ndarray:
    """``[n]`` -> ``[cycle]``: the sum of every ``cycle``-long stretch (the last one zero-padded)."""
    padded = np.zeros(-(-signal.size // cycle) * cycle)
    padded[: signal.size] = signal
    return padded.reshape(-1, cycle).sum(axis=0)


def read(audio: np.ndarray, templates: Templates) -> Reading:
    """Whitened, folded ``audio`` ``[n]`` at ``DETECT_RATE`` -> ``Reading``."""
    folded = fold(drop_hop_periodic(whiten(audio)), templates.cycle)
    spectrum = np.fft.rfft(folded)
    # corr[s] = sum_m pilot[m + s] * folded[m]: high where the crop started at cycle position s.
    corr = np.fft.irfft(templates.pilot_spectrum * np.conj(spectrum), n=templates.cycle)
    spread = np.median(np.abs(corr)) / 0.6745 + 1e-30  # robust: the peak itself does not inflate it
    peak = int(np.argmax(np.abs(corr)))
    score = float(abs(corr[peak]) / spread)
    polarity = 1.0 if corr[peak] >= 0 else -1.0  # an inverted signal still carries the mark
    # Fraction of a sample from the parabola through the peak and its neighbours.
    left, mid, right = (abs(corr[(peak + d) % templates.cycle]) for d in (-1, 0, 1))
    denom = left - 2 * mid + right
    lag = peak + (0.5 * (left - right) / denom if denom < 0 else 0.0)
    # Undo the shift: aligned[i] = folded[i - lag], the cycle from its own start.
    k = np.arange(spectrum.size)
    aligned = np.fft.irfft(spectrum * np.exp(-2j * np.pi * k * lag / templates.cycle), n=templates.cycle)
    layout = templates.layout
    cells = carrier.frame_spectra(aligned, DETECT_RATE)
    proj = polarity * np.real(cells * np.exp(-1j * layout.phase))
    data = layout.bit >= 0
    soft = np.bincount(layout.bit[data], weights=proj[data], minlength=payload.CODED_BITS)
    return Reading(score=score, lag=float(lag), soft_bits=soft)
