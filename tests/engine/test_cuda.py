"""The CosyVoice 2 engine with its model on a CUDA device gives the CPU's audio: the LM's scores, whole and streamed
synthesis through the scheduler (several requests at once), the direct paths, and the bfloat16 precision that
``auto`` picks there. Skipped where torch sees no CUDA device (run on a GPU machine: docs/performance.md, "GPU")."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest
import torch

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.lm_decode import DecodeStep
from cadenza.engine.precision import Precision
from cadenza.engine.scheduler import SchedulerConfig
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.layers.kv_pool import KVPool
from cadenza.models.cosyvoice2.speakers import SpeakerStore

from small_model import decode_rows, small_model, voice

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine)")


@pytest.fixture(scope="module")
def models():
    cpu = small_model()
    return cpu, copy.deepcopy(cpu).to("cuda")


def _engine(model, precision: Precision | None = None) -> CosyVoice2Engine:
    return CosyVoice2Engine(model, frontend=None, speakers=SpeakerStore(None), schedule=StreamSchedule(),
                            scheduler_config=SchedulerConfig(max_active=8), precision=precision)


def _token_request(engine: CosyVoice2Engine, tokens: int, seed: int):
    """A request whose speech tokens are given (the LM is skipped): the same tokens on both devices."""
    gen = torch.Generator().manual_seed(seed)
    req = engine.build(text_ids=torch.ones(1, 4, dtype=torch.long), voice=voice(engine.model, 12, seed), mode="test",
                       seed=seed)
    req.source_tokens = torch.randint(0, engine.config.flow.vocab_size, (1, tokens), generator=gen)
    return req


def snr_db(ref: np.ndarray, out: np.ndarray) -> float:
    assert ref.shape == out.shape
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(np.sum((ref - out) ** 2.0), 1e-30)))


def test_lm_scores_and_cache_match_cpu(models):
    cpu, gpu = models
    gen = torch.Generator().manual_seed(1)
    text = torch.randint(0, 100, (1, 9), generator=gen)
    speech = torch.randint(0, cpu.config.lm.speech_token_size, (1, 7), generator=gen)
    with torch.inference_mode():
        ref = cpu.lm(cpu.lm.build_input(text, None, speech))
        out = gpu.lm(gpu.lm.build_input(text, None, speech))
    assert out.device.type == "cuda"
    assert torch.allclose(out.cpu(), ref, atol=1e-4, rtol=1e-4)


def test_whole_and_streamed_audio_match_cpu(models):
    cpu, gpu = models
    ref_engine, engine = _engine(cpu), _engine(gpu)
    try:
        for tokens in (30, 87):
            ref = ref_engine.synthesize(_token_request(ref_engine, tokens, seed=tokens))
            out = engine.synthesize(_token_request(engine, tokens, seed=tokens))
            assert out.dtype == np.float32 and np.isfinite(out).all()
            assert snr_db(ref, out) > 30
            ref_chunks = list(ref_engine.stream(_token_request(ref_engine, tokens, seed=tokens)))
            chunks = list(engine.stream(_token_request(engine, tokens, seed=tokens)))
            assert [len(c) for c in chunks] == [len(c) for c in ref_chunks]
            assert snr_db(np.concatenate(ref_chunks), np.concatenate(chunks)) > 30
    finally:
        ref_engine.close()
        engine.close()


def test_concurrent_lm_requests_on_cuda(models):
    """Four LM-decoded requests at once (batched decode steps over per-request caches on the device): each makes
    exactly its token count of audio, finite, and the direct single-request path agrees in length."""
    _, gpu = models
    engine = _engine(gpu)
    lengths = [20, 33, 41, 26]
    out: dict[int, int] = {}

    def run(i: int) -> None:
        req = engine.build(text_ids=torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(i)),
                           voice=voice(gpu, 10, i), mode="test", seed=i)
        req.min_tokens = req.max_tokens = lengths[i]
        audio = np.concatenate(list(engine.stream(req)))
        assert np.isfinite(audio).all()
        out[i] = audio.size

    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(lengths))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        hop = engine.token2wav.hop
        assert out == {i: n * hop for i, n in enumerate(lengths)}
        req = engine.build(text_ids=torch.ones(1, 8, dtype=torch.long), voice=None, mode="test", seed=3)
        req.min_tokens = req.max_tokens = 15
        assert engine.synthesize_direct(req).size == 15 * hop
    finally:
        engine.close()


def test_auto_precision_on_cuda_is_bfloat16_and_close(models):
    cpu, _ = models
    precision = Precision.choose("auto", "cuda")
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    assert not precision.is_float32
    ref_engine = _engine(copy.deepcopy(cpu).to("cuda"))
    engine = _engine(copy.deepcopy(cpu).to("cuda"), precision)
    try:
        ref = ref_engine.synthesize(_token_request(ref_engine, 60, seed=5))
        out = engine.synthesize(_token_request(engine, 60, seed=5))
        assert snr_db(ref, out) > 10  # bfloat16 flow + HiFT on random weights (CPU: docs/performance.md)
    finally:
        ref_engine.close()
        engine.close()


def _rows(model, step: DecodeStep, lengths: list[int]) -> torch.Tensor:
    out, caches = decode_rows(model, step, lengths, steps=12, device="cuda")
    for c in caches:
        c.free()
    return out


def test_graph_decode_step_equals_per_row(models):
    """The CUDA-graph step (3 rows in a bucket of 4, spans crossing 256) and the eager pooled step give the per-row
    step's log-probabilities."""
    _, gpu = models
    q = gpu.config.lm.qwen
    lengths = [3, 250, 40]
    ref = _rows(gpu, DecodeStep(gpu.lm), lengths)

    def pool() -> KVPool:
        return KVPool(q.num_hidden_layers, q.num_key_value_heads, q.head_dim, 4, 512, device="cuda")

    eager = _rows(gpu, DecodeStep(gpu.lm, pool()), lengths)
    graphed_step = DecodeStep(gpu.lm, pool(), cuda_graphs=True)
    graphed = _rows(gpu, graphed_step, lengths)
    assert set(graphed_step._graphs) == {(4, 256), (4, 512)}
    assert torch.allclose(eager, ref, atol=1e-4, rtol=1e-4)
    assert torch.allclose(graphed, ref, atol=1e-4, rtol=1e-4)


def test_engine_on_cuda_uses_pool_and_graphs(models):
    _, gpu = models
    engine = _engine(gpu)
    try:
        step = engine.scheduler.decode_step
        assert step.pool is not None and step.cuda_graphs and step.pool.slots == 8
    finally:
        engine.close()
