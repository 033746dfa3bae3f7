"""A lone request: a new voice primed beside the LM (CosyVoice 2); VoxCPM 2's lone worker takes every core only on
an idle machine (``MachineLoad``), which is read from /proc/stat."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza import Cadenza
from cadenza.engine.lm_worker import LMWorker
from cadenza.engine.machine_load import MachineLoad
from cadenza.engine.scheduler import Scheduler, SchedulerConfig
from cadenza.engine.vocoder_workers import PRIME, VocoderWorker
from cadenza.engine.voxcpm2 import VoxCPM2Engine

REAL_IDLE = MachineLoad.idle  # taken before the suite pins it (conftest)
TEXT = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]


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


def test_a_new_voice_is_primed_beside_the_lm(tts):
    """A stream of a voice not primed yet: its vocoder worker primes it while the LM decodes (not the caller before
    the LM starts), and the audio equals a stream of the voice primed beforehand."""
    sched = Scheduler(tts.engine.model, config=SchedulerConfig())
    try:
        request = tts.request(text_ids=TEXT * 2, seed=3)
        assert request.voice not in sched._primed
        pieces: list[tuple[str, str]] = []
        worker_vocode, lm_step = VocoderWorker.vocode, LMWorker.step

        def vocode(self, work):
            pieces.append(("prime" if work[0][2] is PRIME else "vocoder", threading.current_thread().name))
            return worker_vocode(self, work)

        def step(self, active, inboxes):
            pieces.append(("lm", threading.current_thread().name))
            return lm_step(self, active, inboxes)

        VocoderWorker.vocode, LMWorker.step = vocode, step
        try:
            handle = sched.submit(request, stream=True)
            assert handle._job.needs_priming and handle._job.flow_session is None  # submit did not prime
            first = np.concatenate(list(handle))
            again = np.concatenate(list(sched.submit(tts.request(text_ids=TEXT * 2, seed=3), stream=True)))
        finally:
            VocoderWorker.vocode, LMWorker.step = worker_vocode, lm_step
        primes = [name for kind, name in pieces if kind == "prime"]
        assert len(primes) == 1 and primes[0].startswith("cadenza-vocoder")  # once: the second stream hit the cache
        assert request.voice in sched._primed and sched._primed.misses == 1 and sched._primed.hits == 1
        # The LM decoded while the voice was primed: its steps came before the first chunk, not after the priming.
        first_chunk = [k for k, (kind, _) in enumerate(pieces) if kind == "vocoder"][0]
        assert pieces.index(("prime", primes[0])) < first_chunk and any(
            kind == "lm" for kind, _ in pieces[:first_chunk])
        np.testing.assert_allclose(first, again, atol=1e-5, rtol=0)
    finally:
        sched.close()


def test_voxcpm2_a_lone_request_takes_every_core_on_an_idle_machine(vx2_model_dir):
    torch.set_num_threads(2)
    engine = VoxCPM2Engine.from_pretrained(vx2_model_dir)  # its own: the workers read the cores when they start
    sched = engine.scheduler
    assert isinstance(sched.machine, MachineLoad)
    machine = sched.machine = IdleMachine()
    seen: list[int] = []
    step = sched._step

    def watched(batch):
        seen.append(torch.get_num_threads())
        return step(batch)

    sched._step = watched
    try:
        def lone(seed: int) -> None:
            req = engine.build("Hello the world.", seed=seed, min_len=6, max_len=6)
            assert np.concatenate(list(engine.stream(req))).size > 0

        lone(2)
        assert seen and set(seen) == {2}
        seen.clear()
        machine.is_idle = False  # another process uses the cores: one each, as for two requests
        lone(2)
        assert seen and set(seen) == {1}
        seen.clear()
        machine.is_idle = True
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
