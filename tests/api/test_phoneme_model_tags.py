"""CosyVoice 2's inline tags on the built-in phoneme model, which cannot perform them: they are dropped (their words
kept), and a piece of text that is only tags is skipped where a text stream or an SSML run meets it (it was read
aloud as "laughter", "strong there slash strong" before)."""

from __future__ import annotations

import numpy as np
import pytest

import cadenza
from cadenza.errors import TextError


@pytest.fixture(scope="module")
def tiny():
    with cadenza.load() as tts:
        yield tts


def _stream(tts, pieces: list[str]) -> np.ndarray:
    return np.concatenate(list(tts.synthesize_stream(iter(pieces), seed=3)))


def test_tags_are_dropped_and_a_piece_of_only_tags_is_skipped(tiny):
    assert np.array_equal(tiny.synthesize("Hello <strong>there</strong>.", seed=3).samples,
                          tiny.synthesize("Hello there.", seed=3).samples)
    assert np.array_equal(_stream(tiny, ["Hello there. ", "[laughter]"]), _stream(tiny, ["Hello there."]))
    with_tag = tiny.synthesize("<speak>Hi.<break time='200ms'/>[laughter]</speak>", seed=3).samples
    assert np.array_equal(with_tag, tiny.synthesize("<speak>Hi.<break time='200ms'/></speak>", seed=3).samples)
    assert not tiny.speakable("[laughter] <strong></strong>") and tiny.speakable("[laughter] Ha.")
    with pytest.raises(TextError, match="nothing to speak"):
        tiny.synthesize("[laughter]")
