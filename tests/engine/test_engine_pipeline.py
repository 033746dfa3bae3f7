"""The scheduler's two workers: the LM keeps decoding while a chunk is vocoded, first audio gets the cores, and a
request's state is freed by both workers however it ends."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.scheduler import Scheduler, SchedulerConfig
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.engine.vocoder_workers import VocoderWorker
from cadenza.errors import RequestCancelledError
from cadenza.models.cosyvoice2.speakers import SpeakerStore

from small_model import small_model


@pytest.fixture(scope="module")
def model():
    return small_model()


def _engine(model, **config) -> CosyVoice2Engine:
    return CosyVoice2Engine(model, frontend=None, speakers=SpeakerStore(None), schedule=StreamSchedule(),
                            scheduler_config=SchedulerConfig(**config))


def _request(engine, i: int, tokens: int):
    text = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(i))
    req = engine.build(text_ids=text, voice=None, mode="test", seed=20 + i)
    req.min_tokens = req.max_tokens = tokens
    return req


def _until(predicate, seconds: float = 30.0) -> bool:
    deadline = time.time() + seconds
    while not predicate() and time.time() < deadline:
        time.sleep(0.005)
    return predicate()


@pytest.fixture(autouse=True)
def _restore_vocode():
    """Tests wrap ``VocoderWorker.vocode`` (class-wide: workers are made when the first request arrives)."""
    original = VocoderWorker.vocode
    yield
    VocoderWorker.vocode = original


class _GatedVocoder:
    """Holds a vocoder worker inside the first piece of work that ``hold(work)`` picks until ``release`` (wraps
    ``VocoderWorker.vocode`` for every worker; ``release`` puts it back)."""

    def __init__(self, sched: Scheduler, hold=lambda work: True) -> None:
        self.inside, self.gate, self.work = threading.Event(), threading.Event(), None
        self._original, self._hold = VocoderWorker.vocode, hold
        gated = self

        def vocode(worker, work):
            return gated(worker, work)

        VocoderWorker.vocode = vocode

    def __call__(self, worker, work):
        if not self.inside.is_set() and self._hold(work):
            self.work = [job for job, _, _ in work]
            self.inside.set()
            self.gate.wait(60)
        return self._original(worker, work)

    def release(self) -> None:
        VocoderWorker.vocode = self._original
        self.gate.set()


def _slow_lm(sched: Scheduler, seconds: float) -> None:
    """Each LM step takes at least ``seconds`` (the tiny LM would otherwise finish before anything is observed)."""
    original = sched.lm_worker.step

    def step(*args):
        time.sleep(seconds)
        return original(*args)

    sched.lm_worker.step = step


def test_lm_decodes_while_a_chunk_is_vocoded(model):
    """While the vocoder worker is held inside a chunk of requests that already have audio, the LM worker keeps
    decoding them: the two stages run at the same time."""
    engine = _engine(model, flow_batch_wait_steps=0)
    sched = engine.scheduler
    _slow_lm(sched, 0.002)
    try:
        handles = [sched.submit(_request(engine, i, 900), stream=True) for i in range(2)]
        iters = [iter(h) for h in handles]
        for it in iters:
            next(it)  # both have audio
        gated = _GatedVocoder(sched)
        assert gated.inside.wait(60)
        jobs = [h._job for h in handles]
        assert not all(j.lm_done for j in jobs)
        before = sum(len(j.ids) for j in jobs)
        assert _until(lambda: sum(len(j.ids) for j in jobs) > before + 20), "the LM stopped while the vocoder worked"
        gated.release()
        for it in iters:
            assert all(np.isfinite(c).all() for c in it)
    finally:
        engine.close()


def _old_and_held_first_chunk(engine, n_new: int):
    """A request that has audio ("old") and ``n_new`` new ones, the vocoder worker held inside the first piece of
    work with a first chunk in it: (old, new handles, gate, iterators of old and new)."""
    sched = engine.scheduler
    old = sched.submit(_request(engine, 2, 900), stream=True)
    it_old = iter(old)
    next(it_old)  # "old" has audio
    gated = _GatedVocoder(sched, hold=lambda work: any(job.chunks_out == 0 for job, _, _ in work))
    new = [sched.submit(_request(engine, 3 + i, 900), stream=True) for i in range(n_new)]
    iters = [it_old, *(iter(h) for h in new)]
    assert gated.inside.wait(60)
    time.sleep(0.05)  # an LM step already under way ends
    return old, new, gated, iters


def test_first_audio_gets_the_cores(model):
    """While a request's first chunk is being vocoded, requests that already have audio get no LM steps; one that
    is still waiting for its first chunk does. (One vocoder worker: with two, the other new request's first chunk
    would be vocoded beside the held one.)"""
    engine = _engine(model, flow_batch_wait_steps=0, vocoder_workers=1)
    sched = engine.scheduler
    _slow_lm(sched, 0.002)
    try:
        old, new, gated, iters = _old_and_held_first_chunk(engine, 2)
        assert sched.state.first_audio_pending and not old._job.lm_done
        frozen = len(old._job.ids)
        # Requests still short of their first chunk's tokens (one that already has them awaits its audio and is
        # paused too, by design: which of the new ones got there first is timing).
        others = [h._job for h in new if not any(h._job is j for j in gated.work)
                  and len(h._job.ids) < h._job.first_chunk_tokens]
        before = [len(j.ids) for j in others]
        time.sleep(0.3)
        assert len(old._job.ids) == frozen, "a request that has audio got LM steps during another's first chunk"
        for job, n in zip(others, before):
            assert len(job.ids) > n, "a request still waiting for first audio got no LM steps"
        gated.release()
        for it in iters:
            assert all(np.isfinite(c).all() for c in it)
    finally:
        engine.close()


def _first_chunk_held(model, first_audio_pause: str, cores: int):
    """A request with audio and a new one whose first chunk the (gated) vocoder worker holds, on ``cores`` torch
    threads with single-threaded workers (two vocoder workers): whether the request with audio got LM steps meanwhile."""
    before = torch.get_num_threads()
    torch.set_num_threads(cores)
    engine = _engine(model, flow_batch_wait_steps=0, vocoder_workers=2, vocoder_threads=1, lm_threads=1,
                     first_audio_pause=first_audio_pause)
    sched = engine.scheduler
    _slow_lm(sched, 0.002)
    try:
        old, _, gated, iters = _old_and_held_first_chunk(engine, 1)
        frozen = len(old._job.ids)
        time.sleep(0.3)
        stepped = len(old._job.ids) > frozen or old._job.lm_done
        pending = sched.state.first_audio_pending
        gated.release()
        for it in iters:
            assert all(np.isfinite(c).all() for c in it)
        return stepped, pending
    finally:
        engine.close()
        torch.set_num_threads(before)


def test_contended_first_audio_pause_keeps_decoding_on_a_spare_core(model):
    """"contended": one single-threaded vocoder worker busy on a first chunk leaves a core of two for the LM, so the
    request that has audio keeps decoding; on one core it waits as under "always"."""
    assert _first_chunk_held(model, "contended", cores=2) == (True, False)
    assert _first_chunk_held(model, "contended", cores=1) == (False, True)
    assert _first_chunk_held(model, "always", cores=2) == (False, True)
    with pytest.raises(ValueError, match="first_audio_pause"):
        SchedulerConfig(first_audio_pause="sometimes")


def test_cancel_while_vocoding_frees_both_halves(model):
    engine = _engine(model)
    sched = engine.scheduler
    try:
        handle = sched.submit(_request(engine, 5, 400), stream=True)
        it = iter(handle)
        next(it)
        gated = _GatedVocoder(sched)
        assert gated.inside.wait(60)
        it.close()  # the consumer leaves while its chunk is being computed
        gated.release()
        assert _until(lambda: sched.load == (0, 0))
        job = handle._job
        assert job.done and job.decoder is None and job.synth is None
        with pytest.raises(RequestCancelledError):
            while (item := sched.board.take(job)) is not None:
                if isinstance(item, BaseException):
                    raise item
    finally:
        engine.close()


def test_a_request_that_ends_frees_its_slot_before_the_consumer_sees_the_end(model):
    engine = _engine(model, max_active=1)
    sched = engine.scheduler
    try:
        for i in range(3):
            chunks = list(sched.submit(_request(engine, 6 + i, 60), stream=True))
            assert sum(len(c) for c in chunks) > 0
            assert sched.load == (0, 0)
    finally:
        engine.close()


def test_worker_layout():
    """Unset values follow the cores; set ones are kept."""
    for name in ("vocoder_workers", "lm_threads", "vocoder_threads"):
        with pytest.raises(ValueError, match=name):
            SchedulerConfig(**{name: 0})
    assert SchedulerConfig().worker_layout(1) == (1, 1, 1)
    assert SchedulerConfig().worker_layout(2) == (2, 1, 1)
    assert SchedulerConfig().worker_layout(16) == (2, 8, 8)
    assert SchedulerConfig(vocoder_workers=1).worker_layout(2) == (1, 1, 2)
    assert SchedulerConfig(vocoder_workers=3, lm_threads=2, vocoder_threads=1).worker_layout(16) == (3, 2, 1)


def test_worker_threads(model):
    """Each worker runs with its own intra-op thread count, and the caller's count is left as it was."""
    before = torch.get_num_threads()
    engine = _engine(model, lm_threads=1, vocoder_threads=2, vocoder_workers=2)
    try:
        seen = {}
        sched = engine.scheduler
        vocode, step = VocoderWorker.vocode, sched.lm_worker.step

        def spy_vocode(worker, work):
            seen.setdefault("vocoders", set()).add(threading.current_thread().name)
            seen["vocoder"] = torch.get_num_threads()
            return vocode(worker, work)

        def spy_step(*args):
            seen["lm"] = torch.get_num_threads()
            return step(*args)

        VocoderWorker.vocode, sched.lm_worker.step = spy_vocode, spy_step
        handles = [engine.stream(_request(engine, 9 + i, 60)) for i in range(2)]
        assert all(sum(len(c) for c in h) > 0 for h in handles)
        assert seen == {"lm": 1, "vocoder": 2, "vocoders": {"cadenza-vocoder-0", "cadenza-vocoder-1"}}
        assert torch.get_num_threads() == before
    finally:
        engine.close()
