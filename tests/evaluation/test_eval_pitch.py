"""Pitch of synthesized speech (cadenza.evaluation.pitch) on the built-in model's own voice."""

import numpy as np
import pytest
import torch

from cadenza.audio.pitch import yin_f0
from cadenza.audio.resample import resample
from cadenza.audio.time_scale import ALGORITHMS, time_scale
from cadenza.evaluation.pitch import aligned_f0_ratios, guided_f0, track_ratios, vocoder_f0

TEXTS = ("Please call me back when you get this message.", "We are meeting at the station at nine tomorrow.")


@pytest.fixture(scope="module")
def speech(builtin_tts):
    """Two sentences of the default voice, 24 kHz."""
    return [builtin_tts.synthesize(text, seed=3).samples for text in TEXTS]


def _median(audios, sr, model, reader=guided_f0) -> float:
    return float(torch.cat([reader(a, sr, model) for a in audios]).median())


def test_the_default_voice_reads_as_a_low_male_voice(builtin_tts, speech):
    model, sr = builtin_tts.engine.model, builtin_tts.sample_rate
    f0 = _median(speech, sr, model)
    assert 70 < f0 < 130, f0  # joe, the teacher, reads ~90 Hz
    assert abs(_median(speech, sr, model, vocoder_f0) / f0 - 1) < 0.25  # the same octave as the predictor's


def test_a_pitch_shift_is_read_and_a_time_scale_is_not(builtin_tts, speech):
    """Read frame by frame against the same point of the original: a per-sentence median over each signal's own
    voiced frames moved by up to ±7 % with the seed on these 2 s sentences (which frames a change leaves voiced), for
    a pitch shift and a time-scale alike (docs/controls.md, "Reading the pitch")."""
    model, sr = builtin_tts.engine.model, builtin_tts.sample_rate
    # Played 1.25x faster (resampled, then read at the original rate): every period is 1.25x shorter.
    for audio in speech:
        shifted = resample(torch.from_numpy(audio), sr, int(sr / 1.25)).numpy()
        ratios = aligned_f0_ratios(shifted, audio, 1.25, sr, model)
        assert ratios.numel() > 50
        assert abs(float(ratios.median()) - 1.25) < 0.01, float(ratios.median())
        assert float(((ratios - 1.25).abs() < 0.05).float().mean()) > 0.75
    # Either time-scale at double speed keeps the periods (a resampling speed-up would read 2).
    for method in ALGORITHMS:
        for audio in speech:
            faster = time_scale(audio, 2.0, sr, method).astype(np.float32)
            ratios = aligned_f0_ratios(faster, audio, 2.0, sr, model)
            assert ratios.numel() > 25
            assert abs(float(ratios.median()) - 1) < 0.02, (method, float(ratios.median()))
            assert float(((ratios - 1).abs() < 0.05).float().mean()) > 0.6, method


def test_track_ratios_compare_the_same_moment():
    """A tone gliding 100 -> 150 Hz over 2 s and the same glide in 1 s: compared at the same moment of the glide
    (rate 2) they read 1; frame j against frame j (rate 1) the fast glide is ahead and reads high."""
    sr, hop = 16000, 160
    t1, t2 = np.arange(2 * sr) / sr, np.arange(sr) / sr
    slow = np.sin(2 * np.pi * (100 * t1 + 12.5 * t1 ** 2)).astype(np.float32)  # f = 100 + 25 t
    fast = np.sin(2 * np.pi * (100 * t2 + 25 * t2 ** 2)).astype(np.float32)  # f = 100 + 50 t

    def track(audio: np.ndarray) -> torch.Tensor:
        return yin_f0(torch.from_numpy(audio), sr, hop, fmin=60, fmax=300)

    ratios = track_ratios(track(fast), track(slow), 2.0)
    assert ratios.numel() > 90 and float((ratios - 1).abs().max()) < 0.02
    wrong = track_ratios(track(fast), track(slow), 1.0)
    assert float(wrong.median()) > 1.1
    with pytest.raises(ValueError, match="rate"):
        track_ratios(track(fast), track(slow), 0.0)


def test_any_rate_and_silence(builtin_tts, speech):
    model, sr = builtin_tts.engine.model, builtin_tts.sample_rate
    at_16k = resample(torch.from_numpy(speech[0]), sr, 16000).numpy()
    assert abs(float(guided_f0(at_16k, 16000, model).median()) / float(guided_f0(speech[0], sr, model).median()) - 1) < 0.03
    assert guided_f0(np.zeros(sr, np.float32), sr, model).numel() == 0
    assert vocoder_f0(np.zeros(sr, np.float32), sr, model).numel() == 0
