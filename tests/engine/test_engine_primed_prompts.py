"""Primed flow prompts: a voice's prompt state is computed once and copied per request, with the same audio."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.primed_prompts import PrimedPrompts, prompt_digest
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.models.cosyvoice2.speakers import SpeakerStore

from small_model import small_model, voice


@pytest.fixture(scope="module")
def model():
    return small_model()


def _engine(model, **schedule) -> CosyVoice2Engine:
    return CosyVoice2Engine(model, frontend=None, speakers=SpeakerStore(None), schedule=StreamSchedule(**schedule),
                            scheduler_config=SchedulerConfig(vocoder_workers=1))


def _stream(engine, prompt, seed: int) -> np.ndarray:
    text = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(seed))
    req = engine.build(text_ids=text, voice=prompt, mode="test", seed=seed)
    req.min_tokens = req.max_tokens = 90
    return np.concatenate(list(engine.stream(req)))


def test_requests_of_one_voice_share_its_primed_prompt_and_sound_the_same(model):
    prompt = voice(model, 60, seed=1)  # 60 tokens: two complete chunks of its own
    plain, primed = _engine(model, primed_prompt_cache_mb=0), _engine(model)
    try:
        assert plain.scheduler._primed is None
        for seed in (3, 4):
            # a copy of the voice (another object, same content) hits the cache as well
            again = dataclasses.replace(prompt) if seed == 4 else prompt
            np.testing.assert_allclose(_stream(primed, again, seed), _stream(plain, prompt, seed), atol=1e-5, rtol=0)
        cache = primed.scheduler._primed
        assert (cache.misses, cache.hits, len(cache)) == (1, 1, 1) and cache.nbytes > 0
    finally:
        plain.close()
        primed.close()
    assert len(cache) == 0  # closing the engine frees the primed prompts


def test_the_cache_keeps_the_recently_used_within_its_bytes(model):
    prompts = [voice(model, 60, seed=s) for s in range(3)]
    one = PrimedPrompts(model.flow, limit_bytes=1 << 40)
    one.session(prompts[0]).close()
    size = one.nbytes
    cache = PrimedPrompts(model.flow, limit_bytes=int(2.5 * size))
    for p in (prompts[0], prompts[1], prompts[0], prompts[2]):  # the third voice evicts the least recent (1)
        cache.session(p).close()
    assert len(cache) == 2 and cache.hits == 1
    cache.session(prompts[1]).close()
    assert cache.misses == 4  # voice 1 had gone
    off = PrimedPrompts(model.flow, limit_bytes=0)
    session = off.session(prompts[0])
    assert len(off) == 0 and session.frames_emitted == 0  # still a primed, usable session for this request
    session.close()
    assert prompt_digest(prompts[0]) == prompt_digest(dataclasses.replace(prompts[0]))
    assert prompt_digest(prompts[0]) != prompt_digest(prompts[1])
