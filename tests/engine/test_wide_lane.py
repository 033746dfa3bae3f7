"""A lone request takes every core (``WideLane``); requests together share them; the process-wide default stays."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza import Cadenza
from cadenza.engine.machine_load import MachineLoad
from cadenza.engine.scheduler import Scheduler, SchedulerConfig
from cadenza.engine.vocoder_workers import PRIME
from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.engine.wide_lane import WideLane

REAL_IDLE = MachineLoad.idle  # taken before the suite pins it (conftest)
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


class IdleMachine:
    """Stands in for ``MachineLoad`` (the tests must not depend on what else runs on the machine)."""

    def __init__(self, idle: bool = True) -> None:
        self.is_idle = idle

    def idle(self) -> bool:
        return self.is_idle


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
        assert isinstance(sched.state.machine, MachineLoad)
        machine = sched.state.machine = IdleMachine()
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

        # Alone again, but another process uses the cores: one core each.
        seen.clear()
        machine.is_idle = False
        assert np.concatenate(list(sched.submit(tts.request(text_ids=TEXT, seed=2), stream=False))).size > 0
        assert seen and {threads for _, threads, _ in seen} == {1}
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
    sched.machine = IdleMachine()
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


def _stat(path: Path, busy_ticks: int, idle_ticks: int) -> None:
    # cpu user nice system idle iowait irq softirq steal (the first line of /proc/stat)
    path.write_text(f"cpu  {busy_ticks} 0 0 {idle_ticks} 7 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")


def test_machine_load_counts_other_processes_busy_time(tmp_path, monkeypatch):
    monkeypatch.setattr(MachineLoad, "idle", REAL_IDLE)  # the suite pins it (conftest)
    stat, tick = tmp_path / "stat", os.sysconf("SC_CLK_TCK")
    _stat(stat, 1000, 5000)
    start = time.monotonic()
    load = MachineLoad(window_s=0.1, stat=stat)
    assert load.others() == pytest.approx(0.0, abs=0.05) and load.idle()  # waited for the first window
    assert time.monotonic() - start >= 0.1
    _stat(stat, 1000 + 20 * tick, 5000 + tick)  # 20 s of busy time: someone else's (this test sleeps)
    assert load.others() == pytest.approx(0.0, abs=0.05)  # within the window: the last value
    time.sleep(0.12)
    value = load.others()
    assert value > 20 / 0.5 and not load.idle(), value  # 20 s of CPU over ~0.1 s of wall: far from idle


def test_machine_load_reads_this_machine_or_says_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(MachineLoad, "idle", REAL_IDLE)
    value = MachineLoad(window_s=0.02).others()
    if Path("/proc/stat").is_file():
        assert value is not None and value >= 0.0
    else:
        assert value is None
    bad = tmp_path / "stat"
    bad.write_text("intr 1 2 3\n")
    for path in (tmp_path / "missing", bad):
        unknown = MachineLoad(window_s=0.0, stat=path)
        assert unknown.others() is None and unknown.others() is None and not unknown.idle()
