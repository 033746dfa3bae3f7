"""Batched HiFT across streaming requests: ``vocode_many`` equals each request's own ``vocode`` call by call.

A small random-weight CosyVoice 2 (no fixtures needed). Requests differ in speaker, seed and prompt length, so
their chunks have different mel lengths (batched in groups of equal length, the rest alone), first chunks (no
caches) and later ones (mel/source caches, cross-fade) meet in the same call, and a ``None`` generator row (fresh
random noise) is accepted.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.scheduler import SchedulerConfig
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.engine.token2wav import StreamSynthesis, flow_mels, vocode_many
from cadenza.engine.vocoder_workers import VocoderWorker
from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow
from cadenza.models.cosyvoice2.model import CosyVoice2Model
from cadenza.models.cosyvoice2.nsf_source import draw_source_noise
from cadenza.models.cosyvoice2.speakers import SpeakerStore

from small_model import small_model, voice

TOL_BATCHED = 1e-5  # batched vs separate HiFT calls: only the batch size of the convolutions differs


@pytest.fixture(scope="module")
def model() -> CosyVoice2Model:
    return small_model()


def synthesis(model, prompt_tokens: int, seed: int) -> StreamSynthesis:
    gen = torch.Generator().manual_seed(1000 + seed)
    return StreamSynthesis(model, voice(model, prompt_tokens, seed), StreamSchedule(), lambda k, g=gen: g)


def chunk_inputs(synths: list[StreamSynthesis], ids: list[list[int]]) -> tuple[list[torch.Tensor], list[bool]]:
    """The next chunk's mel of every synthesis (final when its tokens do not fill another chunk)."""
    finals = [not s.ready(len(i)) for s, i in zip(synths, ids)]
    return flow_mels(synths, ids, finals), finals


def test_vocode_many_equals_separate_calls(model):
    """Four requests chunk by chunk: one copy of each vocoded alone, one copy all together through
    ``vocode_many``; every chunk's audio agrees. Prompts 0, 0, 3 and 50 tokens: the first two share every chunk
    length (batched together all the way), the others have their own (alone, or batched with the first two when
    their lengths meet)."""
    prompts, seeds = [0, 0, 3, 50], [1, 2, 3, 4]
    n_tokens = [130, 130, 150, 120]
    gen = torch.Generator().manual_seed(7)
    tokens = [torch.randint(0, model.config.flow.vocab_size, (n,), generator=gen).tolist() for n in n_tokens]
    alone = [synthesis(model, p, s) for p, s in zip(prompts, seeds)]
    batched = [synthesis(model, p, s) for p, s in zip(prompts, seeds)]
    done = [False] * 4
    batched_groups = 0
    while not all(done):
        live = [i for i in range(4) if not done[i]]
        mels, finals = chunk_inputs([batched[i] for i in live], [tokens[i] for i in live])
        lengths = [batched[i].vocoder.prepare(m)[0].size(2) for i, m in zip(live, mels)]
        batched_groups += len(lengths) - len(set(lengths))
        together = vocode_many([batched[i] for i in live], mels, finals)
        for i, final, audio in zip(live, finals, together):
            expected = alone[i].vocode(alone[i].flow_mel(tokens[i], final), final)
            assert audio.dtype == np.float32 and audio.shape == expected.shape
            np.testing.assert_allclose(audio, expected, atol=TOL_BATCHED, rtol=0)
            assert np.abs(expected).max() > 1e-3  # real audio, not silence
            done[i] = final
    assert batched_groups >= 3  # the batched path really ran (several chunks with a shared mel length)
    for s in alone + batched:
        s.close()


def test_rows_draw_from_their_own_generators(model):
    """The source noise of each batched row is the draw a batch-1 call makes from that row's generator, and it
    leaves each generator where that call leaves it; a None generator draws fresh noise of the right shape."""
    hift = model.hift
    frames = 13
    gens = [torch.Generator().manual_seed(s) for s in (5, 6)]
    noise = hift.draw_noise(frames, [*gens, None])
    length, harmonics = hift.cfg.hop_length * frames, hift.cfg.nb_harmonics + 1
    assert noise.rand_ini.shape == (3, harmonics) and noise.sine_noise.shape == (3, length, harmonics)
    for row, seed in enumerate((5, 6)):
        ref_gen = torch.Generator().manual_seed(seed)
        ref = draw_source_noise(1, length, harmonics, ref_gen)
        assert torch.equal(noise.rand_ini[row], ref.rand_ini[0])
        assert torch.equal(noise.sine_noise[row], ref.sine_noise[0])
        assert torch.equal(gens[row].get_state(), ref_gen.get_state())
    mel = torch.randn(3, hift.cfg.in_channels, frames, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        batched, _ = hift.inference(mel, noise=noise)
        for row, seed in enumerate((5, 6)):
            single, _ = hift.inference(mel[row : row + 1], generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(batched[row : row + 1], single, atol=TOL_BATCHED, rtol=0)


@pytest.mark.parametrize("vocoder_workers", [1, 2])
def test_concurrent_streams_equal_sequential_ones(model, vocoder_workers):
    """Through the scheduler (batched LM steps, flow and HiFT, on one or two vocoder workers): four concurrent
    streams give the audio each gives alone."""
    engine = CosyVoice2Engine(model, frontend=None, speakers=SpeakerStore(None), schedule=StreamSchedule(),
                              scheduler_config=SchedulerConfig(max_active=4, vocoder_workers=vocoder_workers))
    try:
        def request(i: int):
            text = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(i))
            req = engine.build(text_ids=text, voice=None, mode="test", seed=10 + i)
            req.min_tokens = req.max_tokens = 80 + 25 * (i % 2)  # two chunk schedules
            return req

        sequential = [np.concatenate(list(engine.stream(request(i)))) for i in range(4)]
        results: dict[int, np.ndarray] = {}

        def run(i: int) -> None:
            results[i] = np.concatenate(list(engine.stream(request(i))))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        workers = [t for t in threading.enumerate() if t.name.startswith("cadenza-vocoder-")]
        assert len(workers) >= vocoder_workers
        for i, expected in enumerate(sequential):
            assert results[i].shape == expected.shape
            np.testing.assert_allclose(results[i], expected, atol=1e-4, rtol=0)
    finally:
        engine.close()


@pytest.mark.parametrize("batch_streams", [True, False])
def test_unbatched_streams_are_bit_exact_whatever_runs_beside_them(model, batch_streams, monkeypatch):
    """``batch_streams=False``: four concurrent streams, which meet in batched flow / HiFT calls when batching is on
    (checked: the same setup batches), give bit for bit the audio each gives alone."""
    batches: list[int] = []
    real = VocoderWorker._vocoder_batch

    def counting(self, work):
        batches.append(len(work))
        return real(self, work)

    monkeypatch.setattr(VocoderWorker, "_vocoder_batch", counting)
    config = SchedulerConfig(max_active=4, vocoder_workers=1, flow_batch_wait_steps=60, batch_streams=batch_streams)
    engine = CosyVoice2Engine(model, frontend=None, speakers=SpeakerStore(None), schedule=StreamSchedule(),
                              scheduler_config=config)
    try:
        def request(i: int):
            text = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(i))
            req = engine.build(text_ids=text, voice=None, mode="test", seed=30 + i)
            req.min_tokens = req.max_tokens = 80  # one chunk schedule: every chunk can batch
            return req

        sequential = [np.concatenate(list(engine.stream(request(i)))) for i in range(4)]
        assert not batches
        handles = [engine.scheduler.submit(request(i)) for i in range(4)]
        together = [np.concatenate(list(handle)) for handle in handles]
        if batch_streams:
            assert batches and max(batches) > 1
        else:
            assert not batches
            for got, expected in zip(together, sequential):
                np.testing.assert_array_equal(got, expected)
    finally:
        engine.close()


def _stream_audio(model, schedule: StreamSchedule, ids: list[int], batched: bool) -> tuple[np.ndarray, StreamSynthesis]:
    """All chunks of one stream over ``ids`` (through ``flow_mels`` / ``vocode_many`` when ``batched``)."""
    gen = torch.Generator().manual_seed(77)
    synth = StreamSynthesis(model, voice(model, 9, 4), schedule, lambda k, g=gen: g)
    chunks, n = [], 0
    while True:
        while n < len(ids) and not synth.ready(n):
            n += 1
        final = not synth.ready(n)
        if batched:
            chunks.append(vocode_many([synth], flow_mels([synth], [ids[:n]], [final]), [final])[0])
        else:
            chunks.append(synth.finish(ids[:n]) if final else synth.next_chunk(ids[:n]))
        if final:
            return np.concatenate(chunks), synth


@pytest.mark.parametrize("batched", [False, True])
def test_a_stream_past_its_flow_cache_limit_goes_on_by_recomputing(model, batched, caplog):
    """``flow_cache_limit_mb``: once a stream's cached flow state exceeds it, the cache is freed and later chunks
    recompute the prefix; the audio is the same as with the cache kept."""
    ids = torch.randint(0, model.config.flow.vocab_size, (140,), generator=torch.Generator().manual_seed(3)).tolist()
    cached, kept = _stream_audio(model, StreamSchedule(), ids, batched)
    assert isinstance(kept.flow.session, IncrementalFlow) and kept.chunks >= 3
    with caplog.at_level("INFO", logger="cadenza.engine.token2wav"):
        bounded, switched = _stream_audio(model, StreamSchedule(flow_cache_limit_mb=0.001), ids, batched)
    assert not hasattr(switched.flow, "session"), "the cached flow was kept past its limit"
    assert "recomputing from now on" in caplog.text
    assert bounded.shape == cached.shape
    np.testing.assert_allclose(bounded, cached, atol=1e-4, rtol=0)
    kept.close()
    switched.close()
    with pytest.raises(ValueError, match="flow_cache_limit_mb"):
        StreamSchedule(flow_cache_limit_mb=-1)
