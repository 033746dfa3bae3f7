"""The VoxCPM 2 scheduler (``engine/voxcpm2_scheduler.py``) on the fixture's ``tiny_model/``: requests of every mode
run concurrently, batched, and give what each gives alone; streams equal whole utterances; cancel, busy, failure
isolation, slow readers, retry and close.

Fixtures: ``$CADENZA_FIXTURES_VOXCPM2`` (default ``<repo>/../shared/fixtures/voxcpm2``); skipped when absent.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.errors import CadenzaError, EngineBusyError, InputError, RequestCancelledError
from cadenza.models.voxcpm2.retry import generate_with_retry
from helpers import assert_close

# Not bit for bit: batched requests differ from their runs alone by float rounding, because CPU GEMM kernels (MKL)
# sum in another order for another number of rows (a batch-invariant product would give up the batching gain).
# Measured here: <= 4e-7 on waveforms of peak 0.5. The noise, stop decisions and retry verdicts are the same (patch
# counts and seeds are compared exactly).
BATCH_TOL = 1e-5
STREAM_TOL = 1e-5  # streamed (chunk by chunk) vs one-shot decoding of the same latents
TIMEOUT = 120  # seconds any wait in these tests may take before it counts as a hang


class _IdleMachine:
    def idle(self) -> bool:
        return True


@pytest.fixture(scope="module")
def engine(vx2_dir: Path):
    eng = VoxCPM2Engine.from_pretrained(vx2_dir / "tiny_model")
    # A lone request's worker takes every core only on an idle machine (``MachineLoad``): pinned here, so "alone
    # equals the batch-1 functions" (run at the caller's thread count) holds whatever else the machine runs.
    eng.scheduler.machine = _IdleMachine()
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def wavs(vx2_dir: Path) -> dict[str, Path]:
    return {"reference": vx2_dir / "wavs" / "ref_16k.wav", "prompt": vx2_dir / "wavs" / "prompt_16k.wav"}


def specs(wavs: dict) -> list[tuple[str, dict, bool]]:
    """(text, build arguments, stream) of requests covering every mode, several cfg / timesteps groups and retry."""
    ref, prompt = {"reference_wav": wavs["reference"]}, {"prompt_wav": wavs["prompt"], "prompt_text": "This is it."}
    return [
        ("Hello, this is a test.", {"seed": 3}, True),
        ("(A calm voice)Hello, this is it.", {"seed": 4}, False),  # voice design
        ("Hello the world.", {"seed": 2, "cfg_value": 1.5, **ref}, True),  # reference cloning
        ("Hello the world.", {"seed": 1, "inference_timesteps": 6, **prompt}, False),  # continuation
        ("Hello the world.", {"seed": 7, **ref, **prompt}, True),  # combined
        ("你好世界。hello", {"seed": 1, "cfg_value": 3.0}, False),
        ("Hi\nthere   you.", {"seed": 9, "retry_ratio": 2.0}, False),  # first attempt bad: retried
        ("Hi\nthere   you.", {"seed": 9, "retry_ratio": 2.0, "stream_holdback": 22}, True),  # retried, held back
        ("A longer sentence to read here.", {"seed": 5, "min_len": 14, "max_len": 14}, True),
    ]


def run(engine: VoxCPM2Engine, text: str, kwargs: dict, stream: bool):
    req = engine.build(text, **kwargs)
    wav = np.concatenate(list(engine.stream(req))) if stream else engine.synthesize(req)
    return req, wav


def run_concurrently(engine: VoxCPM2Engine, jobs: list) -> dict:
    """Run each of ``jobs`` (callables) in its own thread; the workers are held until all have submitted, so the
    steps are batched from the first one. Returns {index: result or exception}."""
    out: dict[int, object] = {}

    def worker(i: int) -> None:
        try:
            out[i] = jobs[i]()
        except Exception as exc:  # handed to the test
            out[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    with engine.scheduler.exclusive():
        for t in threads:
            t.start()
        wait_for(lambda: sum(engine.scheduler.load) == len(jobs), "all submitted")
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive(), "a request hung"
    return out


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.005)


def test_alone_equals_unbatched_functions(engine, wavs):
    """One request through the scheduler is the batch-1 code path: the same numbers as ``generate_with_retry``, up
    to float reduction order (bit-equal when the scheduler's worker and the caller run the same number of torch
    threads; a lone worker takes every core the engine saw when it was built, which under xdist need not be the
    caller's count at the time: 1e-7 apart then)."""
    for text, kwargs, _ in specs(wavs)[:4]:
        req = engine.build(text, **kwargs)
        wav = engine.synthesize(req)
        ref = generate_with_retry(engine.model, req.layout, req.target_len, req.options, req.retry, req.seed)
        assert_close(req.outcome.result.patches, ref.result.patches, BATCH_TOL, f"{text!r}: patches")
        assert_close(wav, engine.decode(ref.result), BATCH_TOL, f"{text!r}: audio")


def test_concurrent_equals_sequential(engine, wavs):
    cases = specs(wavs)
    alone = [run(engine, *case) for case in cases]
    steps_before = engine.scheduler.steps
    got = run_concurrently(engine, [lambda c=c: run(engine, *c) for c in cases])
    assert engine.scheduler.max_batch >= 3 and engine.scheduler.steps > steps_before
    for i, ((req, wav), case) in enumerate(zip(alone, cases)):
        assert not isinstance(got[i], Exception), got[i]
        other, batched = got[i]
        assert [(a.seed, a.n_patches, a.stopped, a.bad) for a in other.outcome.attempts] == \
            [(a.seed, a.n_patches, a.stopped, a.bad) for a in req.outcome.attempts], case[0]
        assert other.seed_used == req.seed_used and other.outcome.truncated == req.outcome.truncated
        assert_close(batched, wav, BATCH_TOL, f"request {i} ({case[0]!r}) batched vs alone")
    retried = alone[6][0].outcome.attempts
    assert len(retried) == 2 and retried[0].bad and not retried[1].bad  # the retry case really retried


def test_stream_equals_whole(engine, wavs):
    for text, kwargs, _ in specs(wavs):
        kwargs = {**kwargs, "stream_holdback": 32}  # the retry verdict comes before any audio: streams retry too
        _, whole = run(engine, text, kwargs, stream=False)
        req, streamed = run(engine, text, kwargs, stream=True)
        assert streamed.shape == whole.shape, text
        assert_close(streamed, whole, STREAM_TOL, f"{text!r}: stream vs whole")
    handle = engine.scheduler.submit(engine.build("Hello, this is a test.", seed=3), stream=False)
    chunks = list(handle)
    # Equal up to float reduction order: the scheduler's workers take their share of the cores, the caller all of
    # them (bit-equal with one thread each; with two, 1.3e-7 apart).
    assert len(chunks) == 1
    assert_close(chunks[0], engine.synthesize(engine.build("Hello, this is a test.", seed=3)), BATCH_TOL,
                 "the scheduler's whole output vs the engine's synthesize")


def small_engine(vx2_dir: Path, **limits) -> VoxCPM2Engine:
    return VoxCPM2Engine.from_pretrained(vx2_dir / "tiny_model", scheduler=SchedulerConfig(**limits))


def long_request(engine: VoxCPM2Engine, seed: int = 0):
    return engine.build("A longer sentence to read here.", seed=seed, min_len=60, max_len=60, retry=False)


def test_cancel_frees_slots_and_busy_error(vx2_dir):
    engine = small_engine(vx2_dir, max_active=1, max_queued=1, max_buffered_chunks=2)
    try:
        first = engine.scheduler.submit(long_request(engine, 0))
        it = iter(first)
        assert next(it).size > 0
        second = engine.scheduler.submit(long_request(engine, 1))
        assert engine.scheduler.load == (1, 1)
        with pytest.raises(EngineBusyError):
            engine.scheduler.submit(long_request(engine, 2))
        it.close()  # dropping the iterator cancels; the queued request takes the slot
        wait_for(lambda: engine.scheduler.load == (1, 0), "queued request admitted")
        third = engine.scheduler.submit(long_request(engine, 2))
        assert engine.scheduler.load == (1, 1)
        third.cancel()  # a queued request leaves the queue at once
        assert engine.scheduler.load == (1, 0)
        it = iter(second)
        assert next(it).size > 0
        second.cancel()
        with pytest.raises(RequestCancelledError):
            list(it)
        wait_for(lambda: engine.scheduler.load == (0, 0), "cancelled request freed")
        # a stream closed through the engine frees its state before close() returns
        stream = engine.stream(long_request(engine, 3))
        next(stream)
        stream.close()
        assert engine.scheduler.load == (0, 0)
    finally:
        engine.close()


def test_failure_isolation(engine, wavs):
    good = specs(wavs)[:3]
    alone = [run(engine, *case) for case in good]
    short_noise = [torch.zeros(1, engine.config.feat_dim, engine.config.patch_size)] * 2

    def failing():
        return engine.synthesize(engine.build("Hello there.", seed=0, retry=False, min_len=5, noise=short_noise))

    got = run_concurrently(engine, [failing, *[lambda c=c: run(engine, *c) for c in good]])
    assert isinstance(got[0], InputError) and "replayed noise" in str(got[0])
    for i, (_, wav) in enumerate(alone):
        assert_close(got[i + 1][1], wav, BATCH_TOL, f"request {i} next to a failing one")


def test_batched_step_failure_fails_that_batch_only(vx2_dir, monkeypatch):
    """A failure inside the batched model call fails the requests of that step; the scheduler goes on serving."""
    engine = small_engine(vx2_dir, vocoder_workers=1)
    try:
        from cadenza.engine import voxcpm2_scheduler

        calls = {"n": 0}
        original = voxcpm2_scheduler.step_runs

        def flaky(model, runs, noise):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("boom")
            return original(model, runs, noise)

        monkeypatch.setattr(voxcpm2_scheduler, "step_runs", flaky)
        with pytest.raises(RuntimeError, match="boom"):
            engine.synthesize(engine.build("Hello there.", seed=0, retry=False))
        assert engine.synthesize(engine.build("Hello there.", seed=0, retry=False)).size > 0
    finally:
        engine.close()


def test_slow_reader_holds_up_no_one(vx2_dir):
    engine = small_engine(vx2_dir, max_buffered_chunks=2)
    try:
        slow = engine.scheduler.submit(long_request(engine, 0))
        wait_for(lambda: len(slow._job.buffer) == 2, "the slow stream's buffer to fill")
        fast = engine.synthesize(long_request(engine, 1))  # completes while the slow one waits for its reader
        assert fast.size > 0 and len(slow._job.buffer) <= 2 and not slow._job.done
        streamed = np.concatenate(list(slow))
        assert_close(streamed, engine.synthesize(long_request(engine, 0)), BATCH_TOL, "slow reader's audio")
    finally:
        engine.close()


def test_exclusive_holds_steps_and_close_cancels(vx2_dir):
    engine = small_engine(vx2_dir)
    handle = engine.scheduler.submit(long_request(engine, 0))
    with engine.scheduler.exclusive():
        steps = engine.scheduler.steps
        queued = engine.scheduler.submit(long_request(engine, 1))
        assert engine.scheduler.steps == steps  # nothing runs while held
    it = iter(handle)
    assert next(it).size > 0
    engine.close()
    for chunks in (it, queued):
        with pytest.raises(RequestCancelledError):
            list(chunks)
    assert engine.scheduler.load == (0, 0)
    with pytest.raises(CadenzaError, match="closed"):
        engine.scheduler.submit(long_request(engine, 2))


def test_idle_engine_holds_no_thread_and_lora_changes_wait_for_the_step(vx2_dir):
    engine = small_engine(vx2_dir)
    try:
        chunks = iter(engine.scheduler.submit(long_request(engine, 0)))  # (dropping an iterator cancels)
        first = next(chunks)
        engine.load_lora(vx2_dir / "tiny_lora")  # between two steps of the request in flight
        engine.set_lora_enabled(False)
        chunks = [first, *chunks]
        assert len(chunks) == 60
        wait_for(lambda: not engine.scheduler._threads, "the workers to leave")
        assert engine.synthesize(long_request(engine, 1)).size > 0  # restarted on demand
    finally:
        engine.close()


def test_the_engine_reports_its_requests_to_the_idle_memory_release(engine):
    """Once its last request has ended the VoxCPM 2 engine counts as idle: the process's heap is trimmed once
    (``engine/idle_memory.py``; glibc is there on CI's Linux)."""
    from cadenza.engine.idle_memory import RELEASE

    assert RELEASE.enabled
    deadline = time.time() + TIMEOUT
    while engine.scheduler.load != (0, 0) and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(RELEASE.delay_s + 0.3)  # any trim of earlier requests has run
    before = RELEASE.trims
    run(engine, "Hello, this is a test.", {"seed": 3}, True)
    while RELEASE.trims == before and time.time() < deadline:
        time.sleep(0.02)
    assert RELEASE.trims == before + 1
