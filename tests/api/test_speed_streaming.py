"""Speed while streaming on the built-in model (cadenza-tiny): duration, stream = whole, pitch, first chunk."""

import numpy as np
import pytest
import torch

import cadenza
from cadenza.audio.pitch import yin_f0

TEXT = "The quick brown fox jumps over the lazy dog near the river."


@pytest.fixture(scope="module")
def tts():
    model = cadenza.load()
    yield model
    model.close()


def _f0_median(audio: np.ndarray, sr: int) -> float:
    f0 = yin_f0(torch.from_numpy(audio), sr, sr // 50)
    return float(f0[f0 > 0].median())


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_streamed_speed_scales_duration_keeps_pitch_and_first_chunk(tts, speed):
    sr = tts.sample_rate
    base_chunks = list(tts.synthesize_stream(TEXT, seed=7))
    chunks = list(tts.synthesize_stream(TEXT, seed=7, speed=speed))
    base, fast = np.concatenate(base_chunks), np.concatenate(chunks)
    assert abs(fast.size / base.size * speed - 1) < 0.05  # duration ratio within 5 % of 1 / speed
    whole = tts.synthesize(TEXT, seed=7, speed=speed).samples
    # streamed = non-streamed length within one chunk (the first chunk's length)
    assert abs(fast.size - whole.size) <= chunks[0].size
    assert abs(_f0_median(fast, sr) / _f0_median(base, sr) - 1) < 0.05
    # The first chunk covers the same tokens as at speed 1 (it is not delayed): its mel frames (the audio plus the
    # 8 frames HiFT holds back for the cross-fade) are 1 / speed as many, up to the one frame the stretch may hold.
    frame, held = 480, 8 * 480
    assert abs((chunks[0].size + held) - (base_chunks[0].size + held) / speed) <= 2 * frame


def test_bistreaming_takes_a_speed(tts):
    pieces = ["The quick ", "brown fox ", "jumps."]
    slow = np.concatenate(list(tts.synthesize_stream(iter(pieces), seed=3, speed=0.5)))
    normal = np.concatenate(list(tts.synthesize_stream(iter(pieces), seed=3)))
    assert abs(slow.size / normal.size / 2 - 1) < 0.05
