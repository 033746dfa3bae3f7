"""A lone request takes every core (``WideLane``); requests together share them; the process-wide default stays."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from cadenza import Cadenza
from cadenza.engine.scheduler import Scheduler, SchedulerConfig
from cadenza.engine.vocoder_workers import PRIME
from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.engine.wide_lane import WideLane

TEXT = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]


def _first_op_threads() -> int:
    """The intra-op threads a thread that has not run a parallel op yet starts with."""
    seen = []

    def probe():
        torch.zeros(1 << 16).add_(1)
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return seen[0]


def test_lane_runs_work_with_its_threads_and_raises_its_errors():
    torch.set_num_threads(2)
    lane = WideLane("test-wide", 2)
    out = {}

    def owner():  # a worker that runs on one thread, as the scheduler's do on two cores
        torch.set_num_threads(1)
        torch.zeros(1 << 16).add_(1)
        out["own"] = torch.get_num_threads()
        out["lane"] = lane.run(torch.get_num_threads)
        out["name"] = lane.run(lambda: threading.current_thread().name)
        out["sum"] = lane.run(lambda a, b: a + b, 2, 3)
        with pytest.raises(ValueError, match="bad piece"):
            lane.run(lambda: (_ for _ in ()).throw(ValueError("bad piece")))
        out["after_error"] = lane.run(lambda: torch.is_inference_mode_enabled())
        torch.set_num_threads(2)  # what the scheduler does after starting its workers

    t = threading.Thread(target=owner)
    t.start()
    t.join()
    assert out == {"own": 1, "lane": 2, "name": "test-wide", "sum": 5, "after_error": True}
    assert _first_op_threads() == 2  # the lane did not change what new threads start with
    lane.close()
    with pytest.raises(RuntimeError, match="closed"):
        lane.run(int)


@pytest.fixture(scope="module")
def tts(cv2_dir) -> Cadenza:
    with Cadenza.from_pretrained(cv2_dir) as model:
        yield model


def _watch(sched: Scheduler) -> list[tuple[str, int, int]]:
    """Record (worker, intra-op threads, active requests) of every LM step and vocoder piece."""
    seen: list[tuple[str, int, int]] = []

    def wrap(kind, fn):
        def watched(*args):
            with sched.board.cond:
                active = len(sched.board.active) + len(sched.board.queued)
            label = "prime" if kind == "vocoder" and args[0][0][2] is PRIME else kind
            seen.append((label, torch.get_num_threads(), active))
            return fn(*args)
        return watched

    sched.lm_worker.step = wrap("lm", sched.lm_worker.step)
    for w in sched.vocoders:
        w.vocode = wrap("vocoder", w.vocode)
    return seen


def test_a_lone_request_takes_every_core_and_two_share_them(tts):
    torch.set_num_threads(2)
    sched = Scheduler(tts.engine.model, config=SchedulerConfig())
    try:
        # The workers start with the first request: start them on a short one, then watch.
        list(sched.submit(tts.request(text_ids=TEXT[:3], seed=1), stream=False))
        assert sched.state.lm_threads == 1 and sched.state.vocoder_threads == 1  # the layout on two cores
        seen = _watch(sched)

        whole = np.concatenate(list(sched.submit(tts.request(text_ids=TEXT, seed=2), stream=False)))
        assert whole.size > 0
        assert {(kind, threads) for kind, threads, _ in seen} == {("lm", 2), ("vocoder", 2)}

        seen.clear()
        chunks = list(sched.submit(tts.request(text_ids=TEXT * 2, seed=3), stream=True))
        assert len(chunks) >= 3
        assert ("prime", 1, 1) in seen  # the new voice's flow prompt beside the LM
        vocoder = [threads for kind, threads, _ in seen if kind == "vocoder"]
        assert vocoder[0] == 2  # the first chunk, while the LM waits for it
        assert 1 in vocoder[1:]  # later chunks run beside the LM, on one core
        assert ("lm", 2) in {(kind, threads) for kind, threads, _ in seen}

        # Two requests at once (a bi-streaming one waiting for its text, one whole): everything runs on one core.
        seen.clear()
        waiting = sched.submit(tts.engine.build_bistream(voice=None, mode="default_voice", seed=4), stream=True,
                               bistream=True)
        second = np.concatenate(list(sched.submit(tts.request(text_ids=TEXT, seed=5), stream=False)))
        assert second.size > 0
        assert seen and {threads for _, threads, _ in seen} == {1}
        waiting.feed_text(torch.tensor([TEXT]))
        waiting.end_text()
        assert np.concatenate(list(waiting)).size > 0
    finally:
        sched.close()


def test_threads_set_by_hand_are_kept(tts):
    torch.set_num_threads(2)
    sched = Scheduler(tts.engine.model, config=SchedulerConfig(lm_threads=1, vocoder_threads=1))
    try:
        list(sched.submit(tts.request(text_ids=TEXT[:3], seed=1), stream=False))
        seen = _watch(sched)
        list(sched.submit(tts.request(text_ids=TEXT, seed=2), stream=False))
        assert {threads for _, threads, _ in seen} == {1}
        assert sched.lm_worker.lane is None and all(w.lane is None for w in sched.vocoders)
    finally:
        sched.close()


def test_voxcpm2_a_lone_request_takes_every_core_and_leaves_the_default(vx2_model_dir):
    torch.set_num_threads(2)
    engine = VoxCPM2Engine.from_pretrained(vx2_model_dir)  # its own: the workers read the cores when they start
    sched = engine.scheduler
    seen: list[int] = []
    step = sched._step

    def watched(batch):
        seen.append(torch.get_num_threads())
        return step(batch)

    sched._step = watched
    try:
        req = engine.build("Hello the world.", seed=2, min_len=6, max_len=6)
        assert np.concatenate(list(engine.stream(req))).size > 0
        assert seen and set(seen) == {2}
        assert _first_op_threads() == 2
        seen.clear()
        results = []
        ts = [threading.Thread(target=lambda s=s: results.append(engine.synthesize(
            engine.build("Hello the world.", seed=s, min_len=12, max_len=12)))) for s in (3, 4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=120)
        assert len(results) == 2 and 1 in seen  # two requests: each worker on its own core
    finally:
        engine.close()
