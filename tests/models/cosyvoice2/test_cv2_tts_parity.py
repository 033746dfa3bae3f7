"""End-to-end token2wav parity with the reference ``CosyVoice2Model.tts`` (fixture ``tts_cases.npz``).

The fixture drives the reference's voice-conversion entry (no LM): flow prompt tokens + prompt mel + x-vector from
``flow_cases.npz``, source tokens ``token``. Every HiFT call k was preceded by ``torch.manual_seed(tts_hift_base + k)``;
we give call k a private generator with that seed (the global RNG is never touched).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadenza.engine.stream_schedule import StreamSchedule, TokenChunker, crossfade_windows
from cadenza.engine.token2wav import Token2Wav
from cadenza.models.cosyvoice2.loader import inspect_directory, load_cosyvoice2_weights
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt
from helpers import assert_close

WAV_TOL = 1e-4


@pytest.fixture(scope="module")
def model(cv2_dir):
    return load_cosyvoice2_weights(inspect_directory(cv2_dir))


@pytest.fixture(scope="module")
def inputs(cv2_npz):
    f = cv2_npz("flow_cases")
    voice = SpeakerPrompt(
        prompt_text=torch.zeros(1, 0, dtype=torch.long), llm_prompt_speech=torch.zeros(1, 0, dtype=torch.long),
        flow_prompt_speech=torch.from_numpy(f["prompt_token"]).long(), prompt_mel=torch.from_numpy(f["prompt_feat"]),
        embedding=torch.from_numpy(f["embedding"]),
    )
    return voice, torch.from_numpy(f["token"]).long()


def _seeded(base: int):
    return lambda k: torch.Generator().manual_seed(base + k)


def test_stream_chunks_match_the_reference(model, inputs, cv2_npz, cv2_manifest):
    voice, tokens = inputs
    cases, info = cv2_npz("tts_cases"), cv2_manifest["info"]
    chunks = list(Token2Wav(model, StreamSchedule.reference()).stream(iter(tokens[0].tolist()), voice, _seeded(info["seeds"]["tts_hift_base"])))
    expected = sorted(k for k in cases if k.startswith("stream_chunk"))
    assert len(chunks) == len(expected) == len(info["tts_stream_hift_calls"])
    for chunk, name in zip(chunks, expected):
        assert_close(chunk, cases[name][0], WAV_TOL, name)
    assert sum(len(c) for c in chunks) == tokens.shape[1] * 960


def test_nonstream_and_speed_match_the_reference(model, inputs, cv2_npz, cv2_manifest):
    voice, tokens = inputs
    cases, base = cv2_npz("tts_cases"), cv2_manifest["info"]["seeds"]["tts_hift_base"]
    t2w = Token2Wav(model, StreamSchedule.reference())
    assert_close(t2w.full(tokens, voice, generator=torch.Generator().manual_seed(base)), cases["nonstream_chunk0"][0],
                 WAV_TOL, "nonstream_chunk0")
    fast = t2w.full(tokens, voice, speed=1.5, generator=torch.Generator().manual_seed(base))
    assert_close(fast, cases["nonstream_speed1.5_chunk0"][0], WAV_TOL, "nonstream_speed1.5_chunk0")


def test_chunk_schedule_follows_the_reference_plan(cv2_npz, cv2_manifest):
    plan = cv2_manifest["info"]["flow_stream_plan"]
    n_prompt = cv2_npz("flow_cases")["prompt_token"].shape[1]
    chunker = TokenChunker(StreamSchedule.reference(), prompt_tokens=n_prompt, lookahead=3)
    for step in plan[:-1]:
        assert chunker.offset == step["token_offset"]
        assert chunker.ready(step["tokens_in"]) and not chunker.ready(step["tokens_in"] - 1)
        assert chunker.offset + chunker.hop + 3 == step["tokens_in"]
        chunker.advance()
    assert chunker.offset == plan[-1]["token_offset"]


def test_hop_schedule_is_per_request(model, inputs):
    """The reference mutates the hop on the shared model, so its second stream starts at hop 100. Ours doesn't."""
    voice, tokens = inputs
    t2w = Token2Wav(model, StreamSchedule.reference())
    first = [len(c) for c in t2w.stream(iter(tokens[0].tolist()), voice, _seeded(0))]
    second = [len(c) for c in t2w.stream(iter(tokens[0].tolist()), voice, _seeded(0))]
    assert first == second


def test_crossfade_windows():
    fade_in, fade_out = crossfade_windows(3840, "hamming")
    assert np.allclose(np.concatenate([fade_in, fade_out]), np.hamming(7680))
    assert (fade_in + fade_out).max() > 1.07  # the reference's overlap is ~8 % louder
    fade_in, fade_out = crossfade_windows(3840, "hann")
    assert np.allclose(fade_in + fade_out, 1.0)
