"""A cloned voice's first chunk holds one chunk of tokens whatever its prompt's length (the reference's schedule waits
for the pad to the flow's chunk grid too), and the stream is as long as with the reference's hops."""

from __future__ import annotations

import numpy as np
import pytest

import cadenza
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.errors import InputError

TEXT = "The train leaves at nine tomorrow morning."


def test_off_grid_voice_streams_its_first_chunk_after_one_chunk_of_tokens(builtin_tts):
    tts = builtin_tts
    speech = tts.synthesize("Please leave the package at the front desk.", seed=0).samples
    tokens = tts.voice_from_audio((speech, tts.sample_rate)).flow_prompt_speech.shape[1]
    # Cut the prompt so that it is 12 tokens past the chunk grid (one token per 40 ms of audio).
    cut = speech[: len(speech) - ((tokens - 12) % 25) * 960]
    prompt = tts.voice_from_audio((cut, tts.sample_rate)).flow_prompt_speech.shape[1]
    pad = -prompt % 25
    assert pad, f"the cut prompt has {prompt} tokens, on the grid"
    with cadenza.load(stream_schedule=StreamSchedule(first_hop_on_grid=True)) as on_grid:
        ours = list(tts.synthesize_stream(TEXT, prompt_wav=(cut, tts.sample_rate), seed=3))
        theirs = list(on_grid.synthesize_stream(TEXT, prompt_wav=(cut, tts.sample_rate), seed=3))
    samples_per_token = 960
    # The same tokens (the LM does not see the schedule): the same length in all, the first chunk pad tokens shorter.
    assert sum(c.size for c in ours) == sum(c.size for c in theirs)
    assert theirs[0].size - ours[0].size == pad * samples_per_token
    assert np.abs(np.concatenate(ours)).max() > 0.05  # speech, not silence


def test_stream_schedule_is_checked():
    with pytest.raises(InputError, match="stream_schedule must be a StreamSchedule, not dict"):
        cadenza.load(stream_schedule={"first_hop_on_grid": True})
