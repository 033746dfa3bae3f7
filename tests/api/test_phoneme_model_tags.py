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
    assert tiny.speakable("<|ph:kədˈɛnzə|>")  # a phoneme span alone is speech (an SSML <phoneme>, a lexicon entry)
    with pytest.raises(TextError, match="nothing to speak"):
        tiny.synthesize("[laughter]")



def test_seeds_of_later_requests_wrap_into_the_allowed_range():
    """Sentence k of a text stream uses seed + 1000 k, segment k seed + k: wrapped into [0, 2**63) (VoxCPM 2's
    stream refused its second sentence near the top: tests/api/test_api_voxcpm2.py), low seeds unchanged."""
    from cadenza.api.arguments import MAX_SEED, seed_at

    assert seed_at(5, 1000) == 1005 and seed_at(MAX_SEED - 999, 1000) == 0 and seed_at(None, 3) is None
