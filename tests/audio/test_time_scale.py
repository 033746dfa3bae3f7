"""Speaking-rate building blocks: the streaming mel stretch (CosyVoice 2) and streaming WSOLA (VoxCPM 2)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cadenza.audio.frame_stretch import FrameStretch
from cadenza.audio.pitch import yin_f0
from cadenza.audio.wsola import TimeScaledChunks, Wsola, time_scale


def _pieces(n: int, seed: int) -> list[tuple[int, int]]:
    rng, out, i = np.random.default_rng(seed), [], 0
    while i < n:
        k = int(rng.integers(1, 60))
        out.append((i, min(n, i + k)))
        i += k
    return out


@pytest.mark.parametrize("speed", [0.5, 0.8, 1.25, 2.0])
def test_frame_stretch_in_chunks_is_the_whole_interpolation(speed):
    x = torch.randn(1, 8, 173, generator=torch.Generator().manual_seed(0))
    stretch = FrameStretch(speed)
    parts = [stretch.push(x[:, :, a:b]) for a, b in _pieces(x.size(2), 1)] + [stretch.finish()]
    out = torch.cat(parts, dim=2)
    # The linear interpolation with the scale fixed to ``speed`` (what a chunked stream can know in advance).
    whole = F.interpolate(x, scale_factor=1 / speed, mode="linear", recompute_scale_factor=False)
    assert out.shape == (1, 8, int(173 / speed)) == whole.shape
    torch.testing.assert_close(out, whole, atol=1e-4, rtol=0)
    # Each chunk's frames are out as soon as its input is: never more than one input frame held back.
    stretch, seen = FrameStretch(speed), 0
    for a, b in _pieces(x.size(2), 2):
        seen += stretch.push(x[:, :, a:b]).size(2)
        assert seen >= int((b - 1.5) / speed) - 1


def test_frame_stretch_refuses_rates_out_of_range():
    for speed in (0.49, 2.01, float("nan")):
        with pytest.raises(ValueError, match="speed must be between 0.5 and 2.0"):
            FrameStretch(speed)


def _voiced(sr: int, seconds: float, f0: float = 140.0) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.08 * np.sin(2 * np.pi * 2 * t))) / sr
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 3 * t) ** 2  # syllable-like loudness changes
    return (envelope * (0.5 * np.sin(phase) + 0.25 * np.sin(2 * phase) + 0.1 * np.sin(3 * phase))).astype(np.float32)


def _median_f0(audio: np.ndarray, sr: int) -> float:
    f0 = yin_f0(torch.from_numpy(audio), sr, sr // 100)
    return float(f0[f0 > 0].median())


@pytest.mark.parametrize("speed", [0.5, 0.75, 1.5, 2.0])
def test_wsola_changes_the_duration_not_the_pitch_and_streams_exactly(speed):
    sr = 24000
    x = _voiced(sr, 1.2)
    whole = time_scale(x, speed, sr)
    assert whole.dtype == np.float32 and whole.size == round(x.size / speed)
    assert abs(_median_f0(whole, sr) / _median_f0(x, sr) - 1) < 0.02
    # Same samples in chunks of any size, and the output never lags the input by more than the look-ahead.
    stretch, parts, fed = Wsola(speed, sr), [], 0
    for a, b in [(i, min(x.size, i + 777)) for i in range(0, x.size, 777)]:
        parts.append(stretch.push(x[a:b]))
        fed = b
        out = sum(p.size for p in parts)
        assert out >= (fed - stretch.lookahead_samples) / speed - stretch.frame
    parts.append(stretch.finish())
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    # Loudness kept (the Hann windows a hop apart sum to one): no dip or bump.
    assert abs(np.sqrt(np.mean(whole**2)) / np.sqrt(np.mean(x**2)) - 1) < 0.1


def test_wsola_at_speed_one_is_the_input():
    x = _voiced(16000, 0.5)
    np.testing.assert_allclose(time_scale(x, 1.0, 16000), x, atol=1e-6)


def test_time_scaled_chunks_wrap_a_stream_and_pass_cancel_through():
    class Chunks:
        cancelled = False

        def __iter__(self):
            yield from np.split(_voiced(16000, 0.6), 6)

        def cancel(self):
            self.cancelled = True

    source = Chunks()
    stream = TimeScaledChunks(source, 2.0, 16000)
    out = np.concatenate(list(stream))
    np.testing.assert_array_equal(out, time_scale(_voiced(16000, 0.6), 2.0, 16000))
    stream.cancel()
    assert source.cancelled
    with pytest.raises(ValueError, match="speed must be between"):
        Wsola(3.0, 16000)
