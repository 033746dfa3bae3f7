"""Pitch of synthesized speech (cadenza.evaluation.pitch) on the built-in model's own voice."""

import numpy as np
import pytest
import torch

from cadenza.audio.resample import resample
from cadenza.audio.time_scale import ALGORITHMS, time_scale
from cadenza.evaluation.pitch import guided_f0, vocoder_f0

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


def _ratios(changed, original, sr, model) -> list[float]:
    """Each sentence's median f0 after a change over its own before: as the speed benchmark reads pitch (a median
    pooled over sentences of different pitch also moves when the change shifts their shares of voiced frames)."""
    return [_median([c], sr, model) / _median([o], sr, model) for c, o in zip(changed, original)]


def test_a_pitch_shift_is_read_and_a_time_scale_is_not(builtin_tts, speech):
    model, sr = builtin_tts.engine.model, builtin_tts.sample_rate
    # Played 1.25x faster (resampled, then read at the original rate): every period is 1.25x shorter.
    shifted = [resample(torch.from_numpy(a), sr, int(sr / 1.25)).numpy() for a in speech]
    assert all(abs(r - 1.25) < 0.04 for r in _ratios(shifted, speech, sr, model))
    # Either time-scale at double speed keeps the periods: each sentence within the speed goal's 5 %, their median
    # within 3 % (the vocoder's predictor alone reads a few % low here).
    for method in ALGORITHMS:
        faster = [time_scale(a, 2.0, sr, method).astype(np.float32) for a in speech]
        ratios = _ratios(faster, speech, sr, model)
        assert all(abs(r - 1) < 0.05 for r in ratios) and abs(float(np.median(ratios)) - 1) < 0.03, (method, ratios)


def test_any_rate_and_silence(builtin_tts, speech):
    model, sr = builtin_tts.engine.model, builtin_tts.sample_rate
    at_16k = resample(torch.from_numpy(speech[0]), sr, 16000).numpy()
    assert abs(float(guided_f0(at_16k, 16000, model).median()) / float(guided_f0(speech[0], sr, model).median()) - 1) < 0.03
    assert guided_f0(np.zeros(sr, np.float32), sr, model).numel() == 0
    assert vocoder_f0(np.zeros(sr, np.float32), sr, model).numel() == 0
