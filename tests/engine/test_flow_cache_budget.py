"""The flow cache budget across requests (``SchedulerConfig.flow_cache_budget_mb``, ``engine/memory_budget.py``):
past it the largest streams free their cached flow state and go on recomputing, with the same audio."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.memory_budget import available_bytes, flow_cache_budget
from cadenza.engine.scheduler import SchedulerConfig
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.engine.vocoder_workers import VocoderWorker
from cadenza.models.cosyvoice2.speakers import SpeakerStore

from small_model import small_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model():
    return small_model()


def test_the_budget_is_read_from_the_setting_or_the_free_memory(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n")
    assert available_bytes(CPU, meminfo) == 20000000 * 1024
    assert flow_cache_budget("auto", CPU, meminfo) == 10000000 * 1024  # half of what is free
    assert flow_cache_budget(None, CPU, meminfo) is None
    assert flow_cache_budget(512, CPU, meminfo) == 512 * 2**20
    assert flow_cache_budget("auto", CPU, tmp_path / "absent") is None  # unknown: no bound, not a guess
    meminfo.write_text("MemTotal: x kB\n")
    assert available_bytes(CPU, meminfo) is None
    for bad in (-1, "half", True):
        with pytest.raises(ValueError, match="flow_cache_budget_mb"):
            SchedulerConfig(flow_cache_budget_mb=bad)
    assert SchedulerConfig().flow_cache_budget_mb == "auto"


def _streams(model, budget_mb, watch=None) -> list[np.ndarray]:
    """Three concurrent streams on one vocoder worker; ``watch(total bytes)`` after each budget check."""
    engine = CosyVoice2Engine(model, frontend=None, speakers=SpeakerStore(None), schedule=StreamSchedule(),
                              scheduler_config=SchedulerConfig(max_active=3, vocoder_workers=1,
                                                               flow_cache_budget_mb=budget_mb))
    bound = VocoderWorker._bound_flow_memory

    def watched(self):
        bound(self)
        if watch is not None:
            with self.board.cond:
                watch(sum(j.flow_bytes for j in self.board.active if not j.vocoder_released))

    VocoderWorker._bound_flow_memory = watched
    try:
        def request(i: int):
            text = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(i))
            req = engine.build(text_ids=text, voice=None, mode="test", seed=20 + i)
            req.min_tokens = req.max_tokens = 110 + 20 * i
            return req

        results: dict[int, np.ndarray] = {}

        def run(i: int) -> None:
            results[i] = np.concatenate(list(engine.stream(request(i))))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        return [results[i] for i in range(3)]
    finally:
        VocoderWorker._bound_flow_memory = bound
        engine.close()


def test_streams_past_the_budget_free_their_caches_and_sound_the_same(model, caplog):
    totals: list[int] = []
    unbounded = _streams(model, None, totals.append)
    assert set(totals) == {0}  # no budget: nothing counted, nothing freed
    peak = []
    _streams(model, 1e6, peak.append)  # far above: counted, never freed
    one_chunk = max(peak)
    assert one_chunk > 0
    budget = one_chunk * 0.4 / 2**20  # below what the three streams hold together
    totals.clear()
    with caplog.at_level("INFO", logger="cadenza.engine.token2wav"):
        bounded = _streams(model, budget, totals.append)
    assert "past the flow cache budget" in caplog.text
    # One vocoder worker owns every request, so after each of its checks the total is within the budget.
    assert totals and max(totals) <= budget * 2**20, (max(totals), budget * 2**20)
    for got, want in zip(bounded, unbounded):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
