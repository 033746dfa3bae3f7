"""The pooled KV cache and the batched decode step over it give the per-request caches' log-probabilities: rows of
different lengths, requests that find no slot or outgrow the pool (spilled), slots given back, and the scheduler
with the pool switched on (the CUDA default) producing the same audio as without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.lm_decode import DecodeStep
from cadenza.engine.scheduler import lm_decode_step
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.layers.kv_cache import KVCache
from cadenza.layers.kv_pool import KVPool, PooledKVCache
from cadenza.models.cosyvoice2.speakers import SpeakerStore

from small_model import decode_rows, small_model


@pytest.fixture(scope="module")
def model():
    return small_model()


def _pool(model, slots: int, positions: int) -> KVPool:
    q = model.config.lm.qwen
    return KVPool(q.num_hidden_layers, q.num_key_value_heads, q.head_dim, slots, positions)


def test_pooled_step_equals_per_row(model):
    lengths = [3, 17, 9, 40]
    ref, ref_caches = decode_rows(model, DecodeStep(model.lm), lengths, steps=4)
    pool = _pool(model, slots=4, positions=128)
    out, caches = decode_rows(model, DecodeStep(model.lm, pool), lengths, steps=4)
    assert all(isinstance(c, PooledKVCache) and c.pooled for c in caches)
    assert [c.length for c in caches] == [c.length for c in ref_caches] == [n + 4 for n in lengths]
    assert out.device.type == "cpu" and out.shape == ref.shape
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
    assert pool.free_slots == 0
    for c in caches:
        c.free()
    assert pool.free_slots == 4


def test_no_free_slot_or_too_long_spills_and_stays_equal(model):
    lengths = [5, 30, 12]
    ref, _ = decode_rows(model, DecodeStep(model.lm), lengths, steps=40)
    # two slots for three requests; 64 positions, which the 30-position prompt outgrows after 34 steps
    pool = _pool(model, slots=2, positions=64)
    out, caches = decode_rows(model, DecodeStep(model.lm, pool), lengths, steps=40)
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
    assert caches[2].spilled is not None  # found no slot
    assert caches[1].spilled is not None  # grew past 64 positions
    assert caches[0].pooled and caches[0].length == 45
    assert pool.free_slots == 1  # the spilled one gave its slot back
    assert isinstance(caches[1].spilled, KVCache) and caches[1].length == 70


def test_dropped_cache_gives_its_slot_back(model):
    pool = _pool(model, slots=1, positions=64)
    _, caches = decode_rows(model, DecodeStep(model.lm, pool), [4], steps=1)
    assert pool.free_slots == 0
    del caches
    assert pool.free_slots == 1


def test_config_choices(model):
    assert lm_decode_step(model, SchedulerConfig()).pool is None  # CPU: per-request caches
    step = lm_decode_step(model, SchedulerConfig(max_active=3, lm_kv_pool=True, lm_pool_positions=256))
    assert step.pool.slots == 3 and step.pool.positions == 256 and not step.cuda_graphs
    with pytest.raises(ValueError, match="CUDA"):
        lm_decode_step(model, SchedulerConfig(lm_cuda_graphs=True))
    with pytest.raises(ValueError, match="lm_pool_positions"):
        SchedulerConfig(lm_pool_positions=8)


def test_scheduler_with_pool_makes_the_same_audio(model):
    def run(config: SchedulerConfig) -> list[np.ndarray]:
        engine = CosyVoice2Engine(model, frontend=None, speakers=SpeakerStore(None), schedule=StreamSchedule(),
                                  scheduler_config=config)
        try:
            streams = []
            for i, n in enumerate((18, 33, 25)):  # submitted together: batched decode steps of up to three rows
                req = engine.build(text_ids=torch.randint(0, 100, (1, 7), generator=torch.Generator().manual_seed(i)),
                                   voice=None, mode="test", seed=40 + i)
                req.max_tokens = n
                streams.append(engine.stream(req))
            return [np.concatenate(list(s)) for s in streams]
        finally:
            engine.close()

    ref = run(SchedulerConfig())
    out = run(SchedulerConfig(lm_kv_pool=True, lm_pool_positions=64))
    assert [a.size for a in out] == [a.size for a in ref]
    for a, b in zip(out, ref):
        assert np.abs(a - b).max() < 1e-4
