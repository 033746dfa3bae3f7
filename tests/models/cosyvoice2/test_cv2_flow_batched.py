"""Batched incremental flow: ``IncrementalFlow.push_many`` equals separate ``push`` es of each session.

Sessions differ in prompt (length, none), tokens and position (some pushed alone before), and push equal chunk sizes
(their estimator calls run as one batch) and unequal ones (split into groups) in the same call.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch
from test_cv2_flow_incremental import tiny_flow

import cadenza.models.cosyvoice2.flow_incremental as flow_incremental
from cadenza import Cadenza
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.errors import InputError
from cadenza.layers.stream_cache import RowStreamCaches, StreamCache
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow
from helpers import assert_close

TOL_BATCHED = 1e-5  # batched vs separate pushes: only the row count of the matrix products differs


@pytest.fixture(scope="module")
def flow(cv2_dir):
    cfg = CosyVoice2Config.from_files(cv2_dir / "config.yaml", cv2_dir / "CosyVoice-BlankEN" / "config.json")
    model = TokenToMelFlow(cfg.flow).eval()
    model.load_state_dict(torch.load(cv2_dir / "flow.pt", map_location="cpu", weights_only=True), strict=True)
    return model


def plan(chunk: int, prompts: list[int]) -> list[list[int | None]]:
    """Rounds of pushes for three sessions (None: no push; the last round is the final push of the rest): round 0
    sessions 0 and 1 up to a chunk boundary (as the engine's first hop; different positions afterwards), round 1
    equal sizes for all (session 2 has no prompt: its first push is chunk-aligned), round 2 two equal + one
    different that ends inside a chunk."""
    pads = [-p % chunk for p in prompts]
    return [[chunk + pads[0], 2 * chunk + pads[1], None], [chunk, chunk, chunk],
            [2 * chunk, 2 * chunk, chunk // 3 + 1]]


def session_inputs(flow, prompt_token, prompt_feat, embedding, tokens, n_sessions=3):
    """Per session: (prompt_token, prompt_feat, embedding, tokens) — prompts full / half / none, tokens shifted."""
    ratio = flow.cfg.token_mel_ratio
    half = prompt_token.size(1) // 2
    prompts = [(prompt_token, prompt_feat), (prompt_token[:, :half], prompt_feat[:, : ratio * half]),
               (prompt_token[:, :0], prompt_feat[:, :0])]
    gen = torch.Generator().manual_seed(3)
    return [(*prompts[i % 3], embedding + 0.1 * i * torch.randn(embedding.shape, generator=gen),
             torch.roll(tokens, 7 * i, dims=1)) for i in range(n_sessions)]


def run_rounds(flow, inputs, rounds, batched: bool) -> list[list[torch.Tensor]]:
    """Push the rounds (+ a final round of the rest) with ``push_many`` (batched) or one ``push`` at a time."""
    la = flow.cfg.pre_lookahead_len
    sessions = [IncrementalFlow(flow, p, f, e) for p, f, e, _ in inputs]
    offsets = [0] * len(sessions)
    outs: list[list[torch.Tensor]] = [[] for _ in sessions]
    for r, sizes in enumerate([*rounds, [-1] * len(sessions)]):
        final = r == len(rounds)
        idx, toks, las, finals = [], [], [], []
        for i, n in enumerate(sizes):
            if n is None:
                continue
            tokens = inputs[i][3]
            end = tokens.size(1) if final else offsets[i] + n
            idx.append(i)
            toks.append(tokens[:, offsets[i] : end])
            las.append(None if final else tokens[:, end : end + la])
            finals.append(final)
            offsets[i] = end
        if batched:
            mels = IncrementalFlow.push_many([sessions[i] for i in idx], toks, las, finals)
        else:
            mels = [sessions[i].push(t, la_, final=f) for i, t, la_, f in zip(idx, toks, las, finals)]
        for i, mel in zip(idx, mels):
            outs[i].append(mel)
    for session in sessions:
        session.close()
    return outs


def count_batches(monkeypatch) -> list[int]:
    sizes: list[int] = []
    original = flow_incremental._decode_batch

    def spy(sessions, steps):
        sizes.append(len(sessions))
        return original(sessions, steps)

    monkeypatch.setattr(flow_incremental, "_decode_batch", spy)
    return sizes


def check_batched_equals_separate(flow, inputs, rounds, monkeypatch):
    alone = run_rounds(flow, inputs, rounds, batched=False)
    sizes = count_batches(monkeypatch)
    together = run_rounds(flow, inputs, rounds, batched=True)
    assert sizes and max(sizes) == len(inputs), f"the batched estimator path did not run for all sessions: {sizes}"
    for i, (a, b) in enumerate(zip(alone, together)):
        assert len(a) == len(b)
        for k, (mel_a, mel_b) in enumerate(zip(a, b)):
            assert mel_b.dtype == torch.float32
            assert_close(mel_b, mel_a, TOL_BATCHED, f"session {i} push {k}")


def test_push_many_equals_separate_pushes(flow, cv2_npz, monkeypatch):
    z = cv2_npz("flow_cases")
    chunk = flow.cfg.encoder.static_chunk_size
    tokens = torch.from_numpy(z["token"]).long()
    tokens = tokens.repeat(1, math.ceil((8 * chunk + flow.cfg.pre_lookahead_len) / tokens.size(1)))  # any fixture
    inputs = session_inputs(flow, torch.from_numpy(z["prompt_token"]).long(), torch.from_numpy(z["prompt_feat"]),
                            torch.from_numpy(z["embedding"]), tokens)
    rounds = plan(chunk, [p.size(1) for p, _, _, _ in inputs])
    check_batched_equals_separate(flow, inputs, rounds, monkeypatch)


@pytest.mark.parametrize("left_chunks", [1, -1], ids=["left1", "full-left"])
def test_push_many_with_limited_left_context(left_chunks, monkeypatch):
    """Streams at different positions see different key windows (per-stream attention bias)."""
    flow = tiny_flow(lookahead=2, token_chunk=4, frame_chunk=8, left_chunks=left_chunks)
    gen = torch.Generator().manual_seed(1)
    ratio = flow.cfg.token_mel_ratio
    inputs = session_inputs(flow, torch.randint(0, flow.cfg.vocab_size, (1, 6), generator=gen),
                            torch.randn(1, ratio * 6, flow.cfg.output_size, generator=gen),
                            torch.randn(1, flow.cfg.spk_embed_dim, generator=gen),
                            torch.randint(0, flow.cfg.vocab_size, (1, 48), generator=gen))
    rounds = [*plan(flow.cfg.encoder.static_chunk_size, [p.size(1) for p, _, _, _ in inputs]), [7, 7, 3]]
    check_batched_equals_separate(flow, inputs, rounds, monkeypatch)


def test_push_many_errors_close_the_sessions():
    flow = tiny_flow(lookahead=2, token_chunk=4, frame_chunk=8, left_chunks=-1)
    gen = torch.Generator().manual_seed(2)
    emb = torch.randn(1, flow.cfg.spk_embed_dim, generator=gen)
    tokens = torch.randint(0, flow.cfg.vocab_size, (1, 12), generator=gen)
    empty_token, empty_feat = tokens[:, :0], torch.zeros(1, 0, flow.cfg.output_size)
    a, b = (IncrementalFlow(flow, empty_token, empty_feat, emb) for _ in range(2))
    with pytest.raises(InputError, match="one tokens"):
        IncrementalFlow.push_many([a, b], [tokens], [None], [True])
    with pytest.raises(InputError, match="twice"):
        IncrementalFlow.push_many([a, a], [tokens, tokens], [None, None], [True, True])
    with pytest.raises(InputError, match="look-ahead"):  # b's push is invalid: both sessions are closed
        IncrementalFlow.push_many([a, b], [tokens[:, :4], tokens[:, :4]], [tokens[:, 4:6], tokens[:, 4:9]],
                                  [False, False])
    for session in (a, b):
        assert session.nbytes == 0
        with pytest.raises(InputError, match="closed"):
            session.push(tokens[:, :4], None, final=True)


def test_row_stream_caches_split_and_merge():
    caches = RowStreamCaches([StreamCache(), StreamCache(), StreamCache()])
    x = torch.arange(6 * 2).view(6, 2)
    parts = caches.split(x)
    assert [p[:, 0].tolist() for p in parts] == [[0, 6], [2, 8], [4, 10]]  # rows i and i + n
    assert torch.equal(caches.merge(parts), x)
    with pytest.raises(ValueError, match="multiple"):
        caches.split(torch.zeros(4, 2))


def test_scheduler_batches_flow_chunks_of_concurrent_requests(cv2_dir, monkeypatch):
    """Concurrent streaming requests: their flow chunks go through ``push_many`` together and the audio equals
    the requests run one after the other. (One vocoder worker, so that all three are its requests: each worker
    batches only its own.)"""
    texts = [[5, 17, 42, 99, 3, 8, 9], [7, 8, 9, 10, 11, 12, 13], [20, 21, 22, 23, 24, 25, 26]]
    with Cadenza.from_pretrained(cv2_dir, scheduler=SchedulerConfig(vocoder_workers=1)) as tts:
        eng = tts.engine
        seq = [np.concatenate(list(eng.scheduler.submit(tts.request(text_ids=t, seed=i))))
               for i, t in enumerate(texts)]
        sizes = count_batches(monkeypatch)
        results: dict[int, np.ndarray] = {}
        # All three are submitted before any is read, so they are in the engine together however slowly the
        # consumer threads start (starting a thread per submit let one finish before the next began on a loaded
        # machine: nothing to batch).
        handles = [eng.scheduler.submit(tts.request(text_ids=t, seed=i)) for i, t in enumerate(texts)]

        def run(i: int) -> None:
            results[i] = np.concatenate(list(handles[i]))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert sizes, "no flow chunks were batched"
    for i, expected in enumerate(seq):
        assert len(results[i]) == len(expected)
        np.testing.assert_allclose(results[i], expected, atol=1e-4)
