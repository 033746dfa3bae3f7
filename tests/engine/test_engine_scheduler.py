"""The scheduler: concurrent requests give the same audio as sequential ones, cancellation, limits, bistream."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from cadenza import Cadenza
from cadenza.engine.scheduler import Scheduler, SchedulerConfig
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.errors import EngineBusyError, RequestCancelledError

TEXTS = [[5, 17, 42, 99, 3], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [20, 21, 22], [30, 31, 32, 33, 34, 35, 36]]


@pytest.fixture(scope="module")
def tts(cv2_dir) -> Cadenza:
    with Cadenza.from_pretrained(cv2_dir) as model:
        yield model


def _requests(tts, seeds):
    return [tts.request(text_ids=t, seed=s) for t, s in zip(TEXTS, seeds)]


@pytest.mark.parametrize("stream", [False, True])
def test_concurrent_requests_sound_like_sequential_ones(tts, stream):
    eng = tts.engine
    seq = []
    for req in _requests(tts, [1, 2, 3, 4]):
        chunks = list(eng.scheduler.submit(req, stream=stream))
        seq.append(np.concatenate(chunks))
    results: dict[int, np.ndarray] = {}

    def run(i, req):
        results[i] = np.concatenate(list(eng.scheduler.submit(req, stream=stream)))

    threads = [threading.Thread(target=run, args=(i, r)) for i, r in enumerate(_requests(tts, [1, 2, 3, 4]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i, expected in enumerate(seq):
        # Batched LM steps differ from single ones only by float rounding (~1e-6); tokens and audio agree.
        assert len(results[i]) == len(expected)
        np.testing.assert_allclose(results[i], expected, atol=1e-4)


def test_scheduler_matches_the_direct_path(tts):
    req = tts.request(text_ids=TEXTS[1], seed=9)
    direct = tts.engine.synthesize_direct(tts.request(text_ids=TEXTS[1], seed=9))
    np.testing.assert_allclose(tts.engine.synthesize(req), direct, atol=1e-4)


def test_cancel_frees_the_request(tts):
    sched = tts.engine.scheduler
    handle = sched.submit(tts.request(text_ids=TEXTS[1] * 4, seed=1), stream=True)
    it = iter(handle)
    first = next(it)
    assert len(first) > 0
    it.close()  # the consumer walks away
    deadline = time.time() + 30
    while sched.load != (0, 0) and time.time() < deadline:
        time.sleep(0.01)
    assert sched.load == (0, 0)
    job = handle._job
    assert job.done and job.decoder is None and job.synth is None


def test_queue_full_is_a_clear_busy_error(cv2_dir):
    tts = Cadenza.from_pretrained(cv2_dir)
    sched = Scheduler(tts.engine.model, StreamSchedule(), SchedulerConfig(max_active=1, max_queued=1))
    gate = threading.Event()
    original = sched.lm_worker.step

    def slow_step(*args):
        gate.wait(30)
        original(*args)

    sched.lm_worker.step = slow_step
    try:
        handles = [sched.submit(tts.request(text_ids=TEXTS[0], seed=i), stream=False) for i in range(2)]
        # wait until the worker took the first request, so one is active and one queued
        deadline = time.time() + 10
        while sched.load != (1, 1) and time.time() < deadline:
            time.sleep(0.01)
        with pytest.raises(EngineBusyError, match="busy"):
            sched.submit(tts.request(text_ids=TEXTS[0], seed=5), stream=False)
        gate.set()
        for h in handles:
            assert len(np.concatenate(list(h))) > 0
    finally:
        gate.set()
        sched.close()
    with pytest.raises(Exception, match="closed"):
        sched.submit(tts.request(text_ids=TEXTS[0], seed=5))


def test_close_cancels_waiting_consumers(cv2_dir):
    tts = Cadenza.from_pretrained(cv2_dir)
    req = tts.engine.build_bistream(voice=None, mode="default_voice", seed=1)
    handle = tts.engine.stream_bistream(req)  # never fed: waits for text
    tts.close()
    with pytest.raises(RequestCancelledError):
        list(handle)


def test_bistream_audio_starts_before_the_text_ends(tts):
    req = tts.engine.build_bistream(voice=None, mode="default_voice", seed=3)
    handle = tts.engine.stream_bistream(req)
    pieces = list(range(40, 100))
    it = iter(handle)
    for i in pieces[:30]:
        handle.feed_text(torch.tensor([[i]]))
    first = next(it)  # 30 text tokens are enough for several 5:15 rounds: audio arrives while text is still open
    assert len(first) > 0
    for i in pieces[30:]:
        handle.feed_text(torch.tensor([[i]]))
    handle.end_text()
    rest = list(it)
    assert len(rest) >= 1 and all(np.isfinite(c).all() for c in rest)


def test_bistream_failure_of_the_text_source_reaches_the_consumer(tts):
    req = tts.engine.build_bistream(voice=None, mode="default_voice", seed=3)
    handle = tts.engine.stream_bistream(req)
    handle.feed_text(torch.tensor([[5, 6]]))
    handle.fail(RuntimeError("upstream LLM died"))
    with pytest.raises(RuntimeError, match="upstream LLM died"):
        list(handle)


def test_finished_requests_free_their_slot_at_once(cv2_dir):
    tts = Cadenza.from_pretrained(cv2_dir)
    sched = Scheduler(tts.engine.model, StreamSchedule(), SchedulerConfig(max_active=1, max_queued=4))
    try:
        for seed in range(3):  # with one slot, each request can only run if the previous one released it
            audio = np.concatenate(list(sched.submit(tts.request(text_ids=TEXTS[2], seed=seed), stream=False)))
            assert len(audio) > 0
            assert sched.load == (0, 0)
    finally:
        sched.close()


def test_bistream_with_no_text_ends(tts):
    req = tts.engine.build_bistream(voice=None, mode="default_voice", seed=3)
    handle = tts.engine.stream_bistream(req)
    handle.end_text()
    assert list(handle) == []
