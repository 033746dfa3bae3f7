"""Incremental (cached) streaming flow: every push equals re-running the flow over the whole prefix (docs/design.md, "CosyVoice 2 streaming schedule").

Reference for a non-final push of tokens ``[offset, end)`` with look-ahead ``[end, end + L)``:
``flow.inference(tokens[:end + L], streaming=True, finalize=False)[..., ratio * offset:]``; for the final push:
``flow.inference(tokens, streaming=True, finalize=True)[..., ratio * offset:]``. A push whose look-ahead is cut short
returns only the frames that call gives (the rest come later); ``tests/models/cosyvoice2/test_cv2_stream_property.py`` checks every
push pattern that way on small random flows.
"""

from __future__ import annotations

import pytest
import torch

from cadenza.engine.stream_schedule import StreamSchedule, TokenChunker
from cadenza.errors import InputError
from cadenza.layers.masks import chunk_mask
from cadenza.layers.positional import EspnetRelPositionalEncoding
from cadenza.layers.relpos_attention import rel_shift
from cadenza.layers.stream_cache import StreamCache
from cadenza.models.cosyvoice2.config import (
    CFMConfig,
    CosyVoice2Config,
    EstimatorConfig,
    FlowConfig,
    FlowEncoderConfig,
)
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow
from helpers import assert_close

TOL_INCREMENTAL = 1e-4  # against our own full recomputation (measured ~2e-6: only reduction order differs)
TOL_MEL = 1e-3  # against the reference fixtures (README tolerance)


@pytest.fixture(scope="module")
def flow(cv2_dir):
    cfg = CosyVoice2Config.from_files(cv2_dir / "config.yaml", cv2_dir / "CosyVoice-BlankEN" / "config.json")
    model = TokenToMelFlow(cfg.flow).eval()
    model.load_state_dict(torch.load(cv2_dir / "flow.pt", map_location="cpu", weights_only=True), strict=True)
    return model


@pytest.fixture(scope="module")
def case(cv2_npz):
    z = cv2_npz("flow_cases")
    return {
        "z": z,
        "token": torch.from_numpy(z["token"]).long(),
        "prompt_token": torch.from_numpy(z["prompt_token"]).long(),
        "prompt_feat": torch.from_numpy(z["prompt_feat"]),
        "embedding": torch.from_numpy(z["embedding"]),
    }


def reference_hops(flow: TokenToMelFlow, prompt_tokens: int, n_tokens: int) -> list[int]:
    """Non-final chunk sizes of the reference's schedule (25 + prompt pad, 50, 100, ...)."""
    lookahead = flow.cfg.pre_lookahead_len
    schedule = StreamSchedule(token_hop_len=flow.cfg.encoder.static_chunk_size, first_hop_on_grid=True)
    chunker = TokenChunker(schedule, prompt_tokens, lookahead)
    hops = []
    while chunker.ready(n_tokens):
        hops.append(chunker.hop)
        chunker.advance()
    return hops


def run_stream(flow, tokens, prompt_token, prompt_feat, embedding, hops, session=None):
    """Push ``hops`` (non-final, each with the real next tokens as look-ahead) then the rest as the final push.

    Returns [(offset, n, final, incremental mel, recomputed mel)] for every push.
    """
    la, ratio = flow.cfg.pre_lookahead_len, flow.cfg.token_mel_ratio
    session = session or IncrementalFlow(flow, prompt_token, prompt_feat, embedding)
    results, offset = [], 0
    for k, n in enumerate([*hops, tokens.size(1) - sum(hops)]):
        final = k == len(hops)
        end = offset + n
        lookahead = None if final else tokens[:, end : end + la]
        mel = session.push(tokens[:, offset:end], lookahead, final=final)
        ref = flow.inference(tokens[:, : end if final else end + la], prompt_token, prompt_feat, embedding,
                             streaming=True, finalize=final)[:, :, ratio * offset :]
        results.append((offset, n, final, mel, ref))
        offset = end
    session.close()
    return results


def check_results(results, ratio: int) -> None:
    for offset, n, final, mel, ref in results:
        assert mel.dtype == torch.float32 and mel.shape == (1, ref.size(1), ratio * n)
        assert_close(mel, ref, TOL_INCREMENTAL, f"push at token {offset} (n={n}, final={final})")


def test_reference_schedule_matches_the_reference_calls(flow, case, cv2_manifest):
    """The engine's hop schedule: each push against the reference's own streaming calls (fixture) and the final
    push + the whole concatenation against the reference's ``streaming=True, finalize=True`` mel."""
    z, la, ratio = case["z"], flow.cfg.pre_lookahead_len, flow.cfg.token_mel_ratio
    plan = cv2_manifest["info"]["flow_stream_plan"]
    hops = reference_hops(flow, case["prompt_token"].size(1), case["token"].size(1))
    assert hops == [call["tokens_in"] - la - call["token_offset"] for call in plan[:-1]]
    results = run_stream(flow, case["token"], case["prompt_token"], case["prompt_feat"], case["embedding"], hops)
    check_results(results, ratio)
    for call, (offset, _, _, mel, _) in zip(plan[:-1], results):
        name = f"stream_call{call['call']}_full"
        assert_close(mel, z[name][:, :, ratio * offset :], TOL_MEL, name)
    full = z["mel_streaming_true_finalize_true"]
    assert_close(results[-1][3], full[:, :, ratio * results[-1][0] :], TOL_MEL, "final push")
    assert_close(torch.cat([r[3] for r in results], dim=2), full, TOL_MEL, "concatenated pushes")


@pytest.mark.parametrize("hops", [[7, 13, 30], [1, 24, 2, 26], [40, 45]], ids=str)
def test_odd_hops_and_partial_chunks(flow, case, hops):
    """Pushes that end inside chunks (kept and recomputed with the next push) and a final partial chunk."""
    results = run_stream(flow, case["token"], case["prompt_token"], case["prompt_feat"], case["embedding"], hops)
    check_results(results, flow.cfg.token_mel_ratio)


def test_without_prompt_and_with_reserved_buffers(flow, case):
    no_prompt = case["prompt_token"][:, :0], case["prompt_feat"][:, :0]
    results = run_stream(flow, case["token"], *no_prompt, case["embedding"], [9, 16, 25])
    check_results(results, flow.cfg.token_mel_ratio)
    session = IncrementalFlow(flow, case["prompt_token"], case["prompt_feat"], case["embedding"],
                              reserve_tokens=case["token"].size(1))
    results = run_stream(flow, case["token"], case["prompt_token"], case["prompt_feat"], case["embedding"], [11, 30],
                         session=session)
    check_results(results, flow.cfg.token_mel_ratio)


def test_short_lookahead_at_the_end_of_the_tokens(flow, case):
    """A non-final push whose look-ahead is cut short (the LM has not produced more yet): as the reference's
    ``finalize=False`` call on the tokens known so far, it gives no frames for the last ``pre_lookahead_len`` known
    tokens (one of them pushed now); the final push gives them, equal to the full computation (issue #19)."""
    tokens, la = case["token"], flow.cfg.pre_lookahead_len
    end = tokens.size(1) - la + 1  # only la - 1 look-ahead tokens exist after the second push
    args = (case["prompt_token"], case["prompt_feat"], case["embedding"])
    with IncrementalFlow(flow, *args) as session:
        first = session.push(tokens[:, :20], tokens[:, 20 : 20 + la])
        second = session.push(tokens[:, 20:end], tokens[:, end:])
        last = session.push(tokens[:, end:], None, final=True)
    ratio, n = flow.cfg.token_mel_ratio, tokens.size(1)
    assert (first.size(2), second.size(2), last.size(2)) == (20 * ratio, (end - 21) * ratio, la * ratio)
    ref = flow.inference(tokens, *args, streaming=True, finalize=True)
    assert_close(last, ref[:, :, ratio * (n - la) :], TOL_INCREMENTAL, "final push after a short look-ahead")
    second_ref = flow.inference(tokens, *args, streaming=True, finalize=False)
    assert_close(second, second_ref[:, :, ratio * 20 :], TOL_INCREMENTAL, "second push (short look-ahead)")
    first_ref = flow.inference(tokens[:, : 20 + la], *args, streaming=True, finalize=False)
    assert_close(first, first_ref, TOL_INCREMENTAL, "first push")


@pytest.mark.parametrize("pattern", ["empty final push", "last push final", "no look-ahead"])
def test_issue_19_85_tokens_as_40_plus_45(flow, case, pattern):
    """Issue #19: 85 tokens pushed as 40 + 45 then the final push. The second push reaches the end of the tokens, so
    its last ``pre_lookahead_len`` tokens have no look-ahead yet: their frames come with the final push, and the
    stream has all 170 frames, each push equal to the reference's call on the tokens known then (the final one: the
    one-call ``streaming=True, finalize=True`` mel)."""
    tokens, la, ratio = case["token"][:, :85], flow.cfg.pre_lookahead_len, flow.cfg.token_mel_ratio
    args = (case["prompt_token"], case["prompt_feat"], case["embedding"])
    with IncrementalFlow(flow, *args) as session:
        first = session.push(tokens[:, :40], None if pattern == "no look-ahead" else tokens[:, 40 : 40 + la])
        if pattern == "last push final":
            outs = [first, session.push(tokens[:, 40:], None, final=True)]
        else:
            outs = [first, session.push(tokens[:, 40:], tokens[:, 85:]), session.push(tokens[:, 85:], None, final=True)]
    seen_first = 40 + (0 if pattern == "no look-ahead" else la)
    refs = [flow.inference(tokens[:, :seen_first], *args, streaming=True, finalize=False)]
    if pattern != "last push final":
        refs.append(flow.inference(tokens, *args, streaming=True, finalize=False))
    refs.append(flow.inference(tokens, *args, streaming=True, finalize=True))
    done = 0
    for k, (mel, ref) in enumerate(zip(outs, refs)):
        assert_close(mel, ref[:, :, done:], TOL_INCREMENTAL, f"push {k}")
        done = ref.size(2)
    assert sum(mel.size(2) for mel in outs) == ratio * 85
    if pattern == "empty final push":
        assert [mel.size(2) for mel in outs] == [ratio * 40, ratio * (45 - la), ratio * la]


def test_close_frees_every_buffer(flow, case):
    session = IncrementalFlow(flow, case["prompt_token"], case["prompt_feat"], case["embedding"])
    session.push(case["token"][:, :30], case["token"][:, 30:33])
    assert session.nbytes > 0 and session.frames_emitted == 30 * flow.cfg.token_mel_ratio
    session.close()
    assert session.nbytes == 0
    with pytest.raises(InputError, match="closed"):
        session.push(case["token"][:, 30:40], None, final=True)
    with IncrementalFlow(flow, case["prompt_token"], case["prompt_feat"], case["embedding"]) as session:
        session.push(case["token"][:, :5], case["token"][:, 5:8])
    assert session.nbytes == 0


def test_interleaved_sessions_do_not_interfere(flow, case):
    """Two sessions (different prompts and hops) on one model, pushed alternately, each equal to running alone."""
    tokens, emb = case["token"], case["embedding"]
    short = case["prompt_token"].size(1) // 2
    ratio = flow.cfg.token_mel_ratio
    voices = [(case["prompt_token"], case["prompt_feat"]),
              (case["prompt_token"][:, :short], case["prompt_feat"][:, : ratio * short])]
    hop_sets = [reference_hops(flow, voices[0][0].size(1), tokens.size(1)), [13, 29, 9]]
    alone = [run_stream(flow, tokens, *voice, emb, hops) for voice, hops in zip(voices, hop_sets)]
    sessions = [IncrementalFlow(flow, *voice, emb) for voice in voices]
    pushes = [[(offset, n, final) for offset, n, final, _, _ in run] for run in alone]
    outputs: list[list[torch.Tensor]] = [[], []]
    la = flow.cfg.pre_lookahead_len
    for step in range(max(map(len, pushes))):
        for i in (0, 1):
            if step < len(pushes[i]):
                offset, n, final = pushes[i][step]
                lookahead = None if final else tokens[:, offset + n : offset + n + la]
                outputs[i].append(sessions[i].push(tokens[:, offset : offset + n], lookahead, final=final))
    for i in (0, 1):
        for mel, (_, _, _, mel_alone, ref) in zip(outputs[i], alone[i]):
            assert torch.equal(mel, mel_alone)
            assert_close(mel, ref, TOL_INCREMENTAL, f"session {i}")
        sessions[i].close()


def test_input_errors(flow, case):
    tokens, la = case["token"], flow.cfg.pre_lookahead_len
    args = (case["prompt_token"], case["prompt_feat"], case["embedding"])
    with pytest.raises(InputError, match="frames"):
        IncrementalFlow(flow, case["prompt_token"], case["prompt_feat"][:, :-1], case["embedding"])
    with IncrementalFlow(flow, *args) as session:
        with pytest.raises(InputError, match="look-ahead"):
            session.push(tokens[:, :10], tokens[:, 10 : 11 + la])
        with pytest.raises(InputError, match="final"):
            session.push(tokens[:, :10], tokens[:, 10:11], final=True)
        session.push(tokens[:, :10], tokens[:, 10 : 10 + la])
        with pytest.raises(InputError, match="differ"):
            session.push(tokens[:, 11:20], tokens[:, 20 : 20 + la])  # skips token 10, announced as look-ahead
    with IncrementalFlow(flow, *args) as session:
        session.push(tokens[:, :10], tokens[:, 10 : 10 + la], final=False)
        with pytest.raises(InputError, match="ends before"):
            session.push(tokens[:, 10:11], None, final=True)
    with IncrementalFlow(flow, *args) as session:
        session.push(tokens[:, :10], None, final=True)
        with pytest.raises(InputError, match="finished"):
            session.push(tokens[:, 10:20], None, final=True)


# --- small random-weight flows: configurations the fixture does not cover ---


def tiny_flow(lookahead: int, token_chunk: int, frame_chunk: int, left_chunks: int, levels: int = 1):
    enc = FlowEncoderConfig(input_size=32, output_size=32, attention_heads=2, linear_units=64, num_blocks=2,
                            num_up_blocks=2, pre_lookahead_len=lookahead, static_chunk_size=token_chunk)
    est = EstimatorConfig(in_channels=32, out_channels=8, channels=(16,) * levels, attention_head_dim=8, n_blocks=1,
                          num_mid_blocks=2, num_heads=2, static_chunk_size=frame_chunk,
                          num_decoding_left_chunks=left_chunks)
    cfg = FlowConfig(vocab_size=50, input_size=32, output_size=8, spk_embed_dim=16, pre_lookahead_len=lookahead,
                     encoder=enc, estimator=est, cfm=CFMConfig(n_timesteps=3, noise_frames=400))
    torch.manual_seed(0)
    return TokenToMelFlow(cfg).eval()


@pytest.mark.parametrize(
    "lookahead,token_chunk,frame_chunk,left_chunks",
    [(2, 4, 6, 1), (0, 4, 8, -1), (3, 5, 10, 0), (1, 3, 7, 2)],
    ids=["la2-c4-f6-left1", "la0-c4-f8", "la3-c5-f10-left0", "la1-c3-f7-left2"],
)
def test_other_configs(lookahead, token_chunk, frame_chunk, left_chunks):
    """Estimator chunks that are not ``ratio`` x the encoder's (mu frames wait for the estimator), limited left
    context in the estimator, no look-ahead at all."""
    flow = tiny_flow(lookahead, token_chunk, frame_chunk, left_chunks)
    gen = torch.Generator().manual_seed(1)
    prompt_token = torch.randint(0, flow.cfg.vocab_size, (1, 5), generator=gen)
    prompt_feat = torch.randn(1, flow.cfg.token_mel_ratio * 5, flow.cfg.output_size, generator=gen)
    embedding = torch.randn(1, flow.cfg.spk_embed_dim, generator=gen)
    tokens = torch.randint(0, flow.cfg.vocab_size, (1, 40), generator=gen)
    for hops in ([3, 4, 9, 1, 2, 7], [11, 12]):
        results = run_stream(flow, tokens, prompt_token, prompt_feat, embedding, hops)
        check_results(results, flow.cfg.token_mel_ratio)


def test_multi_level_unet_is_refused():
    flow = tiny_flow(2, 4, 8, -1, levels=2)
    cfg = flow.cfg
    with pytest.raises(InputError, match="single-level"):
        IncrementalFlow(flow, torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, cfg.output_size),
                        torch.zeros(1, cfg.spk_embed_dim))


# --- the layer pieces the incremental path relies on ---


def test_rectangular_rel_shift_and_positions():
    """New queries against cached keys: ``rel_shift`` of ``[T1, T2 + T1 - 1]`` scores picks relative position i - j
    (query i at key index T2 - T1 + i), and the positional window holds the matching rows."""
    t1, t2, d = 3, 7, 4
    x = torch.randn(1, 2, t1, t2 + t1 - 1)
    shifted = rel_shift(x)
    assert shifted.shape == (1, 2, t1, t2)
    for i in range(t1):
        for j in range(t2):
            assert torch.equal(shifted[0, :, i, j], x[0, :, i, t1 - 1 - i + j])
    enc = EspnetRelPositionalEncoding(d, max_len=16)
    full = enc.position_encoding(t2)  # positions t2-1 .. -(t2-1)
    _, window = enc(torch.zeros(1, t1, d), past=t2 - t1)  # positions t2-1 .. -(t1-1)
    assert torch.equal(window, full[:, : t2 + t1 - 1])
    assert torch.equal(enc(torch.zeros(1, t2, d))[1], full)


def test_chunk_mask_rows():
    full = chunk_mask(11, 3, num_left_chunks=1)
    assert torch.equal(chunk_mask(11, 3, num_left_chunks=1, query_start=4), full[4:])


def test_stream_cache_keeps_only_committed_state():
    cache = StreamCache()
    x = torch.arange(10.0).view(1, 1, 10)
    full = cache.at(0, 6).left_context("conv", x, 2)
    assert torch.equal(full, torch.cat([torch.zeros(1, 1, 2), x], dim=2))  # zeros before the stream start
    # The next call starts at the commit point: its history is the two input frames before it (4, 5).
    full = cache.at(6, 0).left_context("conv", torch.tensor([[[60.0, 70.0]]]), 2)
    assert full.flatten().tolist() == [4.0, 5.0, 60.0, 70.0]
    kv = cache.kv("attn")
    kv.append(0, torch.ones(1, 1, 5, 2), torch.ones(1, 1, 5, 2))
    kv.crop(3)
    assert cache.kv("attn").length == 3
    up = cache.scaled(2)
    assert (up.start, up.commit) == (12, 0) and up.get("conv") is not None  # same state, twice the rate
    assert cache.nbytes > 0
    cache.free()
    assert len(cache) == 0 and cache.nbytes == 0


def test_noise_buffer_limit_is_checked_before_anything_changes():
    flow = tiny_flow(2, 4, 8, -1)
    cfg = flow.cfg
    too_many = cfg.cfm.noise_frames // cfg.token_mel_ratio + 1
    with IncrementalFlow(flow, torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, cfg.output_size),
                         torch.randn(1, cfg.spk_embed_dim)) as session:
        with pytest.raises(InputError, match="at most"):
            session.push(torch.zeros(1, too_many, dtype=torch.long), None, final=True)
        assert session.push(torch.zeros(1, 3, dtype=torch.long), None, final=True).shape[2] == 3 * cfg.token_mel_ratio


@pytest.mark.parametrize("hops", [None, [7, 13, 30]], ids=["engine schedule", "odd hops"])
def test_a_primed_prompt_cloned_per_request_gives_the_same_mel(flow, case, hops):
    """``prime`` commits the prompt's own complete chunks before any token; clones of the primed session stream as
    a fresh session does (checked against the reference calls), and using one clone leaves the primed state as it
    was for the next."""
    prompt = case["prompt_token"].repeat(1, 3)  # long enough to hold complete chunks of its own
    feat = case["prompt_feat"].repeat(1, 3, 1)
    hops = hops or reference_hops(flow, prompt.size(1), case["token"].size(1))
    primed = IncrementalFlow(flow, prompt, feat, case["embedding"])
    primed.prime()
    assert primed.frames_emitted == 0 and primed._tokens_done >= flow.cfg.encoder.static_chunk_size
    before = primed.nbytes
    for _ in range(2):
        results = run_stream(flow, case["token"], prompt, feat, case["embedding"], hops, session=primed.clone())
        check_results(results, flow.cfg.token_mel_ratio)
        assert primed.nbytes == before
    with pytest.raises(InputError, match="before the first push"):
        primed.prime()
    primed.close()
    with pytest.raises(InputError, match="closed"):
        primed.clone()
