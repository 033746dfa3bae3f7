"""The idle-memory release (``engine/idle_memory.py``): the heap is trimmed once every engine is idle and stays so
for the quiet spell, never while one holds a request, and the engines report their requests to it."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from cadenza import Cadenza
from cadenza.engine.idle_memory import RELEASE, IdleMemoryRelease
from cadenza.engine.scheduler_config import SchedulerConfig

from test_server_harness import wait_until
from toy_model import build_toy_model_dir


def _counting(delay_s: float = 0.05) -> tuple[IdleMemoryRelease, list[float]]:
    calls: list[float] = []
    return IdleMemoryRelease(lambda: calls.append(time.perf_counter()), delay_s=delay_s), calls


def test_trims_once_after_the_quiet_spell():
    release, calls = _counting(delay_s=0.1)
    release.busy()
    time.sleep(0.2)
    assert calls == []  # busy: never
    ended = time.perf_counter()
    release.idle()
    assert wait_until(lambda: len(calls) == 1)
    assert calls[0] - ended >= 0.09  # not before the quiet spell
    time.sleep(0.3)
    assert len(calls) == 1 and release.trims == 1  # once per idle spell, not on a timer


def test_a_request_in_the_quiet_spell_calls_the_trim_off():
    release, calls = _counting(delay_s=0.3)
    release.busy()
    release.idle()
    time.sleep(0.05)
    release.busy()  # a burst of requests: the one that comes within the spell cancels the pending trim
    time.sleep(0.5)
    assert calls == []
    release.idle()
    assert wait_until(lambda: len(calls) == 1)


def test_every_engine_must_be_idle():
    release, calls = _counting()
    release.busy()
    release.busy()  # two engines of one process (a server with two models): the heap is shared
    release.idle()
    time.sleep(0.3)
    assert calls == []
    release.idle()
    assert wait_until(lambda: len(calls) == 1)


def test_a_failing_trim_is_logged_and_the_thread_goes_on(caplog):
    attempts = []

    def trim():
        attempts.append(1)
        raise OSError("no")

    release = IdleMemoryRelease(trim, delay_s=0.01)
    for _ in range(2):
        release.busy()
        release.idle()
        time.sleep(0.1)
    assert len(attempts) == 2 and "releasing free heap memory failed" in caplog.text


def test_without_malloc_trim_nothing_runs():
    release = IdleMemoryRelease(None)
    before = threading.active_count()
    release.busy()
    release.idle()
    assert not release.enabled and threading.active_count() == before


@pytest.fixture(scope="module")
def model_dir(cv2_dir, tmp_path_factory):
    return build_toy_model_dir(cv2_dir, tmp_path_factory.mktemp("toy") / "model")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux's")
@pytest.mark.parametrize("release_idle_memory", [True, False])
def test_the_engine_reports_its_requests(model_dir, release_idle_memory):
    """A CosyVoice 2 engine's finished request leads to one trim of the process's heap (glibc is there: CI's Linux);
    with ``release_idle_memory=False`` its requests do not count."""
    assert RELEASE.enabled
    config = SchedulerConfig(release_idle_memory=release_idle_memory)
    with Cadenza.from_pretrained(model_dir, scheduler=config) as tts:
        wait_until(lambda: tts.engine.scheduler.load == (0, 0))
        time.sleep(RELEASE.delay_s + 0.3)  # any trim of other tests' engines has run
        before = RELEASE.trims
        chunks = list(tts.synthesize_stream(text_ids=[1, 2, 3, 4, 5, 6], prompt_wav=_prompt(), seed=0))
        assert chunks
        if release_idle_memory:
            assert wait_until(lambda: RELEASE.trims == before + 1)
        else:
            time.sleep(RELEASE.delay_s + 0.5)
            assert RELEASE.trims == before


def _prompt():
    t = np.arange(32000) / 16000
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000


def test_no_trim_runs_once_stopped():
    """``stop`` (registered at interpreter exit): a trim pending or asked for later never runs."""
    import time

    from cadenza.engine.idle_memory import IdleMemoryRelease

    calls = []
    release = IdleMemoryRelease(lambda: calls.append(1), delay_s=0.05)
    release.busy()
    release.idle()  # a trim pending, its quiet spell running
    release.stop()
    release.busy()
    release.idle()
    time.sleep(0.3)
    assert calls == [] and release.trims == 0 and not release.enabled
