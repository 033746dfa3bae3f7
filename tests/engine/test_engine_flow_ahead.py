"""Flow computed ahead of a chunk (``StreamSynthesis.flow_ahead``, ``SchedulerConfig.flow_ahead``): the same audio
bit for bit, only sooner (each chunk's flow is cut at a point the schedule fixes, run ahead or not). A small
random-weight CosyVoice 2; the streams feed tokens as an LM would (one at a time)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.scheduler import SchedulerConfig
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.engine.token2wav import StreamSynthesis, flow_ahead_many, flow_mels, vocode_many
from cadenza.engine.vocoder_workers import VocoderWorker
from cadenza.models.cosyvoice2.speakers import SpeakerStore

from small_model import small_model, voice

TOL = 1e-5  # batched with another stream: float32 round-off of other matrix shapes only


@pytest.fixture(scope="module")
def model():
    return small_model()


def _synth(model, prompt_tokens: int, seed: int, schedule: StreamSchedule | None = None) -> StreamSynthesis:
    gen = torch.Generator().manual_seed(500 + seed)
    return StreamSynthesis(model, voice(model, prompt_tokens, seed), schedule or StreamSchedule(),
                           lambda k, g=gen: g)


def _stream(synth: StreamSynthesis, ids: list[int], ahead: bool) -> tuple[list[np.ndarray], int]:
    """Every chunk of ``ids`` with tokens arriving one by one; with ``ahead``, whatever flow can run early runs
    whenever a token arrives and no chunk is ready. Returns (chunks, tokens computed ahead)."""
    chunks, early = [], 0
    for n in range(1, len(ids) + 1):
        if synth.ready(n):
            chunks.append(synth.next_chunk(ids[:n]))
        elif ahead and synth.chunks and (k := synth.flow_ahead_tokens(n)):
            synth.flow_ahead(ids[:n], k)
            early += k
    chunks.append(synth.finish(ids))
    synth.close()
    return chunks, early


@pytest.mark.parametrize("prompt_tokens", [0, 9, 50])
def test_flow_ahead_gives_the_same_chunks(model, prompt_tokens):
    """Chunk by chunk the audio equals the stream without flow ahead bit for bit; flow ahead really ran, only up to
    points where attention chunks of prompt + tokens end, and never past a chunk's end."""
    ids = torch.randint(0, model.config.flow.vocab_size, (330,), generator=torch.Generator().manual_seed(3)).tolist()
    plain, _ = _stream(_synth(model, prompt_tokens, 1), ids, ahead=False)
    synth = _synth(model, prompt_tokens, 1)
    points = []
    original = synth.flow_ahead

    def spy(ids_now, n):
        start = synth.flow_start
        points.append((start + n, synth.chunker.offset + synth.chunker.hop, len(ids_now)))
        original(ids_now, n)

    synth.flow_ahead = spy
    early_chunks, early = _stream(synth, ids, ahead=True)
    assert early >= 100  # chunks of 50 and 100 tokens: their first 25 / 75 tokens ran ahead
    for end, chunk_end, available in points:
        assert (prompt_tokens + end) % 25 == 0 and end < chunk_end and end + 3 <= available
    assert len(early_chunks) == len(plain)
    for got, expected in zip(early_chunks, plain):
        np.testing.assert_array_equal(got, expected)
    assert np.abs(np.concatenate(plain)).max() > 1e-3


@pytest.mark.parametrize("prompt_tokens", [0, 9])
def test_the_audio_does_not_depend_on_when_flow_ahead_ran(model, prompt_tokens):
    """Whether an idle worker computed a chunk's first piece ahead depends on timing (how far the LM had got when
    the worker had nothing ready). It used to compute as far as the tokens then allowed, so the chunk was cut in
    other places from run to run and a seed's audio differed by about one 16-bit step (a server test comparing
    HTTP audio with the Python API's failed now and then on a loaded machine). Any mix of chunks run ahead and not
    gives the same samples; the last chunk too, whether its first piece ran before the LM ended or not."""
    ids = torch.randint(0, model.config.flow.vocab_size, (290,), generator=torch.Generator().manual_seed(5)).tolist()
    plain, _ = _stream(_synth(model, prompt_tokens, 2), ids, ahead=False)
    for pattern in ([True, False], [False, True], [True]):
        synth, chunks, k, offered = _synth(model, prompt_tokens, 2), [], 0, False
        for n in range(1, len(ids) + 1):
            if synth.ready(n):
                chunks.append(synth.next_chunk(ids[:n]))
                offered = False
            elif synth.chunks and not offered and (m := synth.flow_ahead_tokens(n)):
                offered = True  # one decision per chunk, as an idle or busy worker would make it
                if pattern[k % len(pattern)]:
                    synth.flow_ahead(ids[:n], m)
                k += 1
        chunks.append(synth.finish(ids))
        synth.close()
        assert k >= 3, pattern
        assert len(chunks) == len(plain)
        for got, expected in zip(chunks, plain):
            np.testing.assert_array_equal(got, expected)


def test_flow_ahead_batched_and_with_the_recomputing_flow(model):
    """``flow_ahead_many`` over two streams equals each stream's own flow ahead; the recomputing (reference) flow
    has no state to carry frames ahead, so it offers none."""
    gen = torch.Generator().manual_seed(4)
    ids = [torch.randint(0, model.config.flow.vocab_size, (200,), generator=gen).tolist() for _ in range(2)]
    alone = [_synth(model, 0, s) for s in (1, 2)]
    together = [_synth(model, 0, s) for s in (1, 2)]
    first = [s.next_chunk(i[:28]) for s, i in zip(alone, ids)]
    np.testing.assert_allclose(np.concatenate(first),
                               np.concatenate([s.next_chunk(i[:28]) for s, i in zip(together, ids)]), atol=TOL)
    n = alone[0].flow_ahead_tokens(60)
    assert n == 25 and together[1].flow_ahead_tokens(60) == 25
    for s, i in zip(alone, ids):
        s.flow_ahead(i[:60], n)
    flow_ahead_many(together, [i[:60] for i in ids], [n, n])
    assert all(s.flow_start == 50 for s in alone + together)
    finals = [False, False]
    mels = flow_mels(together, [i[:81] for i in ids], finals)
    for s, i, got in zip(alone, ids, vocode_many(together, mels, finals)):
        np.testing.assert_allclose(got, s.next_chunk(i[:81]), atol=TOL, rtol=0)
    for s in alone + together:
        s.close()
    reference = _synth(model, 0, 1, StreamSchedule.reference())
    reference.next_chunk(ids[0][:28])
    assert reference.flow_ahead_tokens(100) == 0
    reference.close()


def _engine_audio(model, flow_ahead: bool, cores: int = 2, never_idle: bool = False
                  ) -> tuple[list[np.ndarray], list[int]]:
    """Two requests one after the other on ``cores`` torch threads with single-threaded workers: (audio, tokens
    computed ahead) of each. ``never_idle``: the vocoder workers never find a moment to compute ahead (as when they
    are always busy), with flow ahead on."""
    before = torch.get_num_threads()
    torch.set_num_threads(cores)
    engine = CosyVoice2Engine(model, frontend=None, speakers=SpeakerStore(None), schedule=StreamSchedule(),
                              scheduler_config=SchedulerConfig(flow_ahead=flow_ahead, vocoder_workers=2,
                                                               vocoder_threads=1, lm_threads=1))
    sched = engine.scheduler
    step = sched.lm_worker.step

    def slow_step(*args):  # the tiny LM would otherwise outrun the vocoder, leaving it no idle moment
        time.sleep(0.003)
        return step(*args)

    sched.lm_worker.step = slow_step
    if never_idle:
        monkeypatch = pytest.MonkeyPatch()
        monkeypatch.setattr(VocoderWorker, "_pick_flow_ahead", lambda self, mine: None)
    try:
        audio, ahead = [], []
        for i in range(2):
            text = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(i))
            req = engine.build(text_ids=text, voice=None, mode="test", seed=30 + i)
            req.min_tokens = req.max_tokens = 260
            handle = sched.submit(req, stream=True)
            audio.append(np.concatenate(list(handle)))
            ahead.append(handle._job.flow_ahead_tokens)
        return audio, ahead
    finally:
        engine.close()
        torch.set_num_threads(before)
        if never_idle:
            monkeypatch.undo()


def test_scheduler_computes_flow_ahead_with_the_same_audio(model):
    """Through the scheduler: an idle vocoder worker with a core of its own computes flow ahead, and the audio is
    bit for bit what workers that never had an idle moment give; none with ``flow_ahead=False``, nor on one core
    (it would slow the LM the chunks wait for), where chunks are not cut either (the same audio to round-off)."""
    with_ahead, ahead = _engine_audio(model, True)
    busy, busy_ahead = _engine_audio(model, True, never_idle=True)
    without, none = _engine_audio(model, False)
    _, one_core = _engine_audio(model, True, cores=1)
    assert min(ahead) > 0 and busy_ahead == none == one_core == [0, 0]
    for got, same, close in zip(with_ahead, busy, without):
        np.testing.assert_array_equal(got, same)
        assert got.shape == close.shape
        np.testing.assert_allclose(got, close, atol=1e-4, rtol=0)


def test_a_batched_chunk_whose_cut_passes_the_flow_cache_limit_recomputes(model):
    """``flow_mels`` cuts each stream's chunk before the batched push; a stream whose cut takes its cached flow past
    ``flow_cache_limit_mb`` goes on recomputing the prefix, so it must leave the batch (it has no session to push)."""
    gen = torch.Generator().manual_seed(6)
    ids = [torch.randint(0, model.config.flow.vocab_size, (120,), generator=gen).tolist() for _ in range(2)]
    probe = _synth(model, 0, 1)
    probe.next_chunk(ids[0][:28])
    after_first = probe.flow_session.nbytes
    probe.flow_ahead(ids[0][:81], probe.flow_ahead_tokens(81))
    after_cut = probe.flow_session.nbytes
    probe.close()
    assert after_cut > after_first
    schedule = StreamSchedule(flow_cache_limit_mb=(after_first + after_cut) / 2 / 2**20)
    alone = [_synth(model, 0, s, schedule) for s in (1, 2)]
    together = [_synth(model, 0, s, schedule) for s in (1, 2)]
    for s, i in zip(alone + together, ids + ids):
        s.next_chunk(i[:28])
    assert all(s.flow_session is not None for s in together)
    mels = flow_mels(together, [i[:81] for i in ids], [False, False])
    assert all(s.flow_session is None for s in together)  # both went over at the cut and recompute now
    for s, i, got in zip(alone, ids, vocode_many(together, mels, [False, False])):
        np.testing.assert_allclose(got, s.next_chunk(i[:81]), atol=TOL, rtol=0)
    for s in alone + together:
        s.close()
