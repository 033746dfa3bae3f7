"""Streaming CosyVoice 2 = recomputation, for every push pattern (issue #19). Small random-weight flows, no fixtures.

What is compared, and how equal it must be:

* The *recompute path* is the reference's stream loop (``CosyVoice2Model.tts(stream=True)``, docs/design.md, "CosyVoice 2 streaming schedule") generalised
  to any pushes: after a non-final push ending at token ``end`` whose look-ahead reaches token ``seen`` (``end`` +
  the look-ahead tokens given, never less than an earlier push's), it runs ``flow.inference(tokens[:seen],
  streaming=True, finalize=False)`` (no frames for the last ``pre_lookahead_len`` of those tokens) and returns the
  frames after those returned before; the final push runs ``flow.inference(all tokens, streaming=True,
  finalize=True)`` and returns the rest. ``IncrementalFlow`` must return, push by push, the same number of frames
  and the same values to ``TOL`` (float32 round-off only: the same chunk masks, causal convolutions and fixed noise,
  computed in other matrix shapes; measured <= 2.4e-6), and in all exactly ``token_mel_ratio`` x the tokens, the frame
  count of the non-streaming call.
* A frame is *not* in general equal to the one-call ``flow.inference(all tokens, streaming=True)``: a push that
  ends inside an attention chunk returns that chunk's frames computed without the chunk's later tokens (the
  reference does the same on such a call; its schedule never makes one). Pushes that end on points where both the
  encoder's and the estimator's chunks end, with a complete look-ahead, do equal the one call
  (``test_chunk_aligned_pushes_equal_one_call``).
* The engine (``StreamSynthesis``: hop schedule, flow computed ahead, the switch to recomputation past the cache
  limit, HiFT caches and cross-fade): with tokens arriving in random bursts, its chunks' mel equal the recomputing
  engine's (same schedule) to ``TOL``, its audio to ``TOL_AUDIO``, and the samples add up to the non-streaming
  ``Token2Wav.full`` length.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.engine.token2wav import StreamSynthesis, Token2Wav
from cadenza.errors import InputError
from cadenza.models.cosyvoice2.config import (
    CFMConfig,
    CosyVoice2Config,
    EstimatorConfig,
    FlowConfig,
    FlowEncoderConfig,
    HiFTConfig,
    LMConfig,
    Qwen2Config,
)
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow
from cadenza.models.cosyvoice2.flow_rate import FrameRate
from cadenza.models.cosyvoice2.model import CosyVoice2Model
from helpers import assert_close, one_torch_thread

from small_model import voice

TOL = 1e-4  # incremental vs recomputed frames under the same chunk masks (as tests/models/cosyvoice2/test_cv2_flow_incremental.py)
TOL_AUDIO = 1e-4  # HiFT of those mels, same noise
SIZES = (1, 2, 3, 7, 85, 101)
MAX_TOKENS = max(SIZES)

# (token_mel_ratio, pre_lookahead_len, encoder chunk (tokens), estimator chunk (frames), estimator left chunks,
# prompt tokens, Euler steps): the reference's proportions (estimator chunk = ratio x encoder chunk, 3 look-ahead
# tokens) with an odd prompt; estimator chunks that straddle encoder chunks; ratios 1 and 3; no look-ahead; a
# look-ahead longer than the chunk. Two Euler steps (one cache each) where it matters most, one elsewhere (speed).
CONFIGS = {
    "ref-like": (2, 3, 5, 10, -1, 7, 2),
    "est6-left1": (2, 2, 4, 6, 1, 0, 2),
    "ratio1": (1, 1, 3, 4, -1, 4, 1),
    "ratio3-la0": (3, 0, 4, 12, 0, 2, 1),
    "la4-chunk2": (2, 4, 2, 8, -1, 5, 1),
}


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():  # tiny models (tests/helpers.py)
        yield


@dataclasses.dataclass
class Case:
    """A flow with a voice and ``MAX_TOKENS`` random tokens; recomputed mels cached by (tokens seen, final)."""

    flow: TokenToMelFlow
    prompt_token: torch.Tensor  # [1, P]
    prompt_feat: torch.Tensor  # [1, ratio * P, mel]
    embedding: torch.Tensor  # [1, spk_embed_dim]
    tokens: torch.Tensor  # [1, MAX_TOKENS]
    cache: dict = dataclasses.field(default_factory=dict)

    @property
    def ratio(self) -> int:
        return self.flow.cfg.token_mel_ratio

    @property
    def lookahead(self) -> int:
        return self.flow.cfg.pre_lookahead_len

    def recomputed(self, n: int, final: bool, speed: float = 1.0) -> torch.Tensor:
        """``flow.inference(tokens[:n], streaming=True, finalize=final, speed=speed)`` -> ``[1, mel, frames]``; the
        frames of the first ``n - pre_lookahead_len`` tokens (all ``n`` when final), none when there are none."""
        key = (n, final, speed)
        if key not in self.cache:
            if self.ratio * (n if final else n - self.lookahead) <= 0:
                self.cache[key] = torch.zeros(1, self.flow.cfg.output_size, 0)
            else:
                self.cache[key] = self.flow.inference(self.tokens[:, :n], self.prompt_token, self.prompt_feat,
                                                      self.embedding, streaming=True, finalize=final, speed=speed)
        return self.cache[key]


def tiny_flow(ratio: int, lookahead: int, token_chunk: int, frame_chunk: int, left_chunks: int, steps: int = 2,
              mel: int = 4, seed: int = 0) -> TokenToMelFlow:
    d = 16
    enc = FlowEncoderConfig(input_size=d, output_size=d, attention_heads=2, linear_units=32, num_blocks=1,
                            num_up_blocks=1, upsample_stride=ratio, pre_lookahead_len=lookahead,
                            static_chunk_size=token_chunk)
    est = EstimatorConfig(in_channels=4 * mel, out_channels=mel, channels=(16,), attention_head_dim=8, n_blocks=1,
                          num_mid_blocks=1, num_heads=2, static_chunk_size=frame_chunk,
                          num_decoding_left_chunks=left_chunks)
    cfg = FlowConfig(vocab_size=50, input_size=d, output_size=mel, spk_embed_dim=8, token_mel_ratio=ratio,
                     pre_lookahead_len=lookahead, encoder=enc, estimator=est,
                     cfm=CFMConfig(n_timesteps=steps, noise_frames=1000))
    torch.manual_seed(seed)
    return TokenToMelFlow(cfg).eval()


@pytest.fixture(scope="module", params=list(CONFIGS), ids=list(CONFIGS))
def case(request) -> Case:
    ratio, lookahead, token_chunk, frame_chunk, left, prompt, steps = CONFIGS[request.param]
    flow = tiny_flow(ratio, lookahead, token_chunk, frame_chunk, left, steps)
    gen = torch.Generator().manual_seed(7)
    cfg = flow.cfg
    return Case(flow, torch.randint(0, cfg.vocab_size, (1, prompt), generator=gen),
                torch.randn(1, ratio * prompt, cfg.output_size, generator=gen),
                torch.randn(1, cfg.spk_embed_dim, generator=gen),
                torch.randint(0, cfg.vocab_size, (1, MAX_TOKENS), generator=gen))


# A push: (new tokens, look-ahead tokens given (cut at the end of the sequence), final).
Push = tuple[int, int, bool]


def stream(case: Case, pushes: Sequence[Push], session: IncrementalFlow | None = None,
           speed: float = 1.0) -> list[torch.Tensor]:
    """Run ``pushes`` on an ``IncrementalFlow`` (at the flow speaking rate ``speed``): the mel ``[1, mel, F_k]`` of
    each push."""
    session = session or IncrementalFlow(case.flow, case.prompt_token, case.prompt_feat, case.embedding)
    if speed != 1.0:
        session.set_speed(speed)
    outs, end = [], 0
    with session:
        for n, a, final in pushes:
            tokens = case.tokens[:, end : end + n]
            end += n
            outs.append(session.push(tokens, None if final else case.tokens[:, end : end + a], final=final))
    return outs


def recompute(case: Case, pushes: Sequence[Push], speed: float = 1.0) -> list[torch.Tensor]:
    """The same pushes on the recompute path (module docstring): the new frames of each push."""
    outs, end, seen, done = [], 0, 0, 0
    for n, a, final in pushes:
        end += n
        seen = max(seen, end + a)
        mel = case.recomputed(end, True, speed) if final else case.recomputed(seen, False, speed)
        outs.append(mel[:, :, done:])
        done = max(done, mel.size(2))
    return outs


def check(case: Case, pushes: Sequence[Push], name: str, outs: list[torch.Tensor] | None = None,
          speed: float = 1.0) -> None:
    total = sum(n for n, _, _ in pushes)
    outs = stream(case, pushes, speed=speed) if outs is None else outs
    expected = recompute(case, pushes, speed)
    assert [o.size(2) for o in outs] == [e.size(2) for e in expected], f"{name}: frames per push"
    prompt = case.prompt_feat.size(1)
    frames = FrameRate(speed, prompt).total(prompt + case.ratio * total) - prompt
    assert sum(o.size(2) for o in outs) == frames, f"{name}: frames in all"
    for k, (got, ref) in enumerate(zip(outs, expected)):
        assert got.dtype == torch.float32
        assert_close(got, ref, TOL, f"{name}, push {k}")


def plain_pushes(hops: Sequence[int], lookahead: int, total: int, empty_final: bool,
                 lookaheads: Sequence[int] | None = None) -> list[Push]:
    """Non-final pushes of ``hops`` (each with ``lookaheads[k]`` look-ahead tokens, default ``lookahead``, cut at
    ``total``), the last hop final unless ``empty_final`` (then all non-final and an empty final push)."""
    pushes, end = [], 0
    for k, n in enumerate(hops):
        end += n
        final = k == len(hops) - 1 and not empty_final
        a = lookahead if lookaheads is None else lookaheads[k]
        pushes.append((n, 0 if final else min(a, total - end), final))
    if empty_final:
        pushes.append((0, 0, True))
    return pushes


def compositions(n: int):
    """Every way to write ``n`` as an ordered sum of positive hops (2^(n-1) of them)."""
    for cuts in itertools.product((False, True), repeat=n - 1):
        hops, run = [], 1
        for cut in cuts:
            if cut:
                hops.append(run)
                run = 1
            else:
                run += 1
        yield [*hops, run]


def test_issue_19_pushes_reaching_the_end_before_the_final_one(case):
    """40 + 45 of 85 tokens: the second push's look-ahead is cut by the end of the tokens; its last tokens' frames
    come with the (empty) final push, so the stream has all 170 frames (ratio 2) and equals the recompute path. Also
    the same with the last push final, and with no look-ahead given at all."""
    la = case.lookahead
    for pushes in ([(40, la, False), (45, 0, False), (0, 0, True)],
                   [(40, la, False), (45, 0, True)],
                   [(40, 0, False), (45, 0, False), (0, 0, True)]):
        check(case, pushes, str(pushes))
    outs = stream(case, [(40, la, False), (45, 0, False), (0, 0, True)])
    assert [o.size(2) for o in outs] == [case.ratio * 40, case.ratio * (45 - la), case.ratio * la]


def test_every_hop_pattern_of_a_short_sequence(case, request):
    """Every composition of 8 tokens (4 for the other configurations, to stay fast), each with the real look-ahead
    (cut at the end of the tokens): 1-token pushes, pushes reaching the end before the final one, the last tokens
    in the final push or an empty final push right after them (alternately for 8 tokens, both for 4)."""
    n = 8 if "ref-like" in request.node.name else 4
    for k, hops in enumerate(compositions(n)):
        for empty_final in ([k % 2 == 1] if n == 8 else [False, True]):
            check(case, plain_pushes(hops, case.lookahead, n, empty_final), f"hops {hops}, empty final {empty_final}")


@pytest.mark.parametrize("n_tokens", SIZES)
def test_sizes_and_odd_lengths(case, n_tokens):
    """Odd and tiny token counts: one final push; one push per token (short sequences) or hops of a few chunks plus
    one token (long ones), with the real look-ahead and last tokens in the final push, or with no look-ahead ever
    given and an empty final push."""
    chunk, la = case.flow.cfg.encoder.static_chunk_size, case.lookahead
    hop = 1 if n_tokens <= 7 else 3 * chunk + 1
    hops = [hop] * (n_tokens // hop) + [n_tokens % hop] * bool(n_tokens % hop)
    patterns = {
        "one final push": [(n_tokens, 0, True)],
        f"hops of {hop}": plain_pushes(hops, la, n_tokens, empty_final=False),
        f"hops of {hop}, no look-ahead": plain_pushes(hops, 0, n_tokens, empty_final=True),
    }
    for name, pushes in patterns.items():
        check(case, pushes, name)


def random_pushes(rng: random.Random, case: Case) -> list[Push]:
    """A random pattern: length from ``SIZES``, hops of random sizes, each push's look-ahead of random length (mostly
    the real one), the end either a final push with tokens or non-final pushes then an empty final push."""
    total = rng.choice(SIZES)
    max_hop = rng.choice([1, 2, case.flow.cfg.encoder.static_chunk_size + 1, 40])
    if total > 20:
        max_hop = max(max_hop, 40)  # keeps a 101-token pattern to about 5 pushes
    hops, left = [], total
    while left:
        hops.append(rng.randint(1, min(left, max_hop)))
        left -= hops[-1]
    lookaheads = [case.lookahead if rng.random() < 0.6 else rng.randint(0, case.lookahead) for _ in hops]
    return plain_pushes(hops, case.lookahead, total, empty_final=rng.random() < 0.5, lookaheads=lookaheads)


def test_random_push_patterns_equal_recompute(case, request):
    """Property: seeded random push patterns (50 for the reference-like configuration, 20 for each other one), each
    equal to the recompute path push by push, ``ratio`` x tokens frames in all."""
    rng = random.Random(19)
    for k in range(50 if "ref-like" in request.node.name else 20):
        pushes = random_pushes(rng, case)
        check(case, pushes, f"pattern {k}: {pushes}")


def test_random_patterns_batched_with_push_many(case):
    """Sessions pushed together (``push_many``, estimator batched where frame counts match) with independent random
    patterns: each equals the recompute path, including pushes that hold every token back (no frames)."""
    rng = random.Random(20)
    patterns = [random_pushes(rng, case) for _ in range(6)]
    sessions = [IncrementalFlow(case.flow, case.prompt_token, case.prompt_feat, case.embedding) for _ in patterns]
    outs: list[list[torch.Tensor]] = [[] for _ in patterns]
    ends = [0] * len(patterns)
    for step in range(max(map(len, patterns))):
        active = [i for i, p in enumerate(patterns) if step < len(p)]
        tokens, lookaheads, finals = [], [], []
        for i in active:
            n, a, final = patterns[i][step]
            tokens.append(case.tokens[:, ends[i] : ends[i] + n])
            ends[i] += n
            lookaheads.append(None if final else case.tokens[:, ends[i] : ends[i] + a])
            finals.append(final)
        for i, mel in zip(active, IncrementalFlow.push_many([sessions[i] for i in active], tokens, lookaheads, finals)):
            outs[i].append(mel)
    for i, pushes in enumerate(patterns):
        sessions[i].close()
        check(case, pushes, f"batched pattern {i}: {pushes}", outs=outs[i])


def test_chunk_aligned_pushes_equal_one_call(case):
    """Pushes ending where both attention chunks end (of prompt + tokens), each with its complete look-ahead: the
    concatenation equals one ``flow.inference(all tokens, streaming=True)`` call, odd total length included."""
    cfg = case.flow.cfg
    frame_chunk = cfg.estimator.static_chunk_size
    boundary = math.lcm(cfg.encoder.static_chunk_size, frame_chunk // math.gcd(frame_chunk, cfg.token_mel_ratio))
    prompt, total, la = case.prompt_token.size(1), MAX_TOKENS, case.lookahead
    # Every other such point whose look-ahead exists (a push cut short there would hold tokens back, ending inside)
    ends = [e - prompt for e in range(boundary, prompt + total, boundary) if 0 < e - prompt <= total - la][::2]
    hops = [b - a for a, b in zip([0, *ends], [*ends, total])]
    outs = stream(case, plain_pushes(hops, case.lookahead, total, empty_final=False))
    assert_close(torch.cat(outs, dim=2), case.recomputed(total, True), TOL, "aligned pushes vs one call")


@pytest.mark.parametrize("speed", [0.5, 1.5, 2.0])
def test_push_patterns_at_a_flow_speaking_rate_equal_recompute(case, speed):
    """``set_speed`` (``speed_method="flow"``: mu resampled to 1/speed of the frames): seeded random push patterns
    and one push per token, each equal push by push to ``flow.inference(..., speed=speed)`` on the tokens seen,
    ``FrameRate.total`` frames in all."""
    rng = random.Random(23)
    for k in range(12):
        pushes = random_pushes(rng, case)
        check(case, pushes, f"speed {speed}, pattern {k}: {pushes}", speed=speed)
    check(case, plain_pushes([1] * 9, case.lookahead, 9, empty_final=False), f"speed {speed}, one token a push",
          speed=speed)


def test_a_primed_session_takes_a_speaking_rate(case):
    """A primed session (its prompt's chunks committed) set to a rate streams as an unprimed one at that rate."""
    pushes = plain_pushes([13, 30, 42], case.lookahead, 85, empty_final=False)
    primed = IncrementalFlow(case.flow, case.prompt_token, case.prompt_feat, case.embedding)
    primed.prime()
    outs = stream(case, pushes, session=primed.clone(), speed=1.5)
    check(case, pushes, "primed at 1.5", outs=outs, speed=1.5)
    session = IncrementalFlow(case.flow, case.prompt_token, case.prompt_feat, case.embedding)
    session.push(case.tokens[:, :4], case.tokens[:, 4:4 + case.lookahead])
    with pytest.raises(InputError, match="before the first push"):
        session.set_speed(2.0)


# --- the engine: token -> wav with the request's hop schedule ---


def small_model(ratio: int, lookahead: int, chunk: int, frame_chunk: int) -> CosyVoice2Model:
    """A random-weight CosyVoice 2 whose flow streams in ``chunk``-token attention chunks (80 mel bins, small
    HiFT)."""
    qwen = Qwen2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                       intermediate_size=64, vocab_size=100)
    flow = tiny_flow(ratio, lookahead, chunk, frame_chunk, -1, steps=2, mel=80).cfg
    flow = dataclasses.replace(flow, vocab_size=6561)
    cfg = dataclasses.replace(CosyVoice2Config(), token_mel_ratio=ratio, chunk_size=chunk,
                              lm=LMConfig(qwen=qwen, llm_input_size=32, llm_output_size=32), flow=flow,
                              hift=HiFTConfig(base_channels=16, f0_cond_channels=16))
    torch.manual_seed(0)
    model = CosyVoice2Model(cfg).eval()
    with torch.no_grad():  # a voiced f0 on part of the frames, as in test_engine_vocoder_batch
        model.hift.f0_predictor.classifier.bias.fill_(40.0)
    return model


ENGINE_MODELS = {
    "ref-like": (2, 3, 5, 10),  # a 5-token first chunk: 10 frames
    "chunk3": (2, 2, 3, 6),  # a 3-token first chunk: 6 frames, fewer than the 8 frames HiFT caches
    "ratio1-la1": (1, 1, 4, 6),  # estimator chunks straddling encoder chunks
}


@pytest.fixture(scope="module", params=list(ENGINE_MODELS), ids=list(ENGINE_MODELS))
def engine_model(request) -> CosyVoice2Model:
    return small_model(*ENGINE_MODELS[request.param])


def engine_stream(model, prompt, ids: list[int], schedule: StreamSchedule, bursts: list[int],
                  ahead: list[bool], speed: float = 1.0) -> tuple[list[torch.Tensor], list[np.ndarray]]:
    """Drive ``StreamSynthesis`` as the scheduler does: tokens arrive in ``bursts``; after each, every ready chunk
    runs and, where ``ahead`` says so, the flow of the next chunk's first tokens runs ahead; then ``finish``.
    Returns each chunk's (mel, audio)."""
    synth = StreamSynthesis(model, prompt, schedule, lambda k: torch.Generator().manual_seed(300 + k), speed=speed)
    mels, audio, n = [], [], 0
    try:
        for k, burst in enumerate(bursts):
            n = min(len(ids), n + burst)
            while synth.ready(n):
                mels.append(synth.flow_mel(ids[:n], final=False))
                audio.append(synth.vocode(mels[-1], final=False))
            if ahead[k] and (m := synth.flow_ahead_tokens(n)):
                synth.flow_ahead(ids[:n], m)
        mels.append(synth.flow_mel(ids, final=True))
        audio.append(synth.vocode(mels[-1], final=True))
    finally:
        synth.close()
    return mels, audio


@pytest.mark.parametrize("n_tokens", [1, 7, 40])
def test_engine_streams_equal_the_recomputing_engine(engine_model, n_tokens):
    """Random token bursts, flow ahead at random moments, and a stream that drops its cache after the first chunk:
    chunk for chunk the same mel and audio as the recomputing engine (same hop schedule, chunk masks on the last
    chunk too), and exactly as many samples as the non-streaming path."""
    model, cfg = engine_model, engine_model.config
    chunk = cfg.flow.encoder.static_chunk_size
    rng = random.Random(n_tokens)
    full_len = Token2Wav(model).hop * n_tokens
    for prompt_tokens in (0, chunk + 2):
        prompt = voice(model, prompt_tokens, seed=n_tokens)
        ids = torch.randint(0, cfg.flow.vocab_size, (n_tokens,), generator=torch.Generator().manual_seed(5)).tolist()
        bursts = []
        while sum(bursts) < n_tokens:
            bursts.append(rng.choice([1, 1, 2, chunk, 3 * chunk]))
        ahead = [rng.random() < 0.5 for _ in bursts]
        base = dict(token_hop_len=chunk, token_max_hop_len=4 * chunk)
        reference = engine_stream(model, prompt, ids, StreamSchedule(incremental=False, **base), bursts, ahead)
        for schedule in (StreamSchedule(**base), StreamSchedule(flow_cache_limit_mb=0, **base)):
            mels, audio = engine_stream(model, prompt, ids, schedule, bursts, ahead)
            name = f"prompt {prompt_tokens}, cache limit {schedule.flow_cache_limit_mb}"
            assert [m.size(2) for m in mels] == [m.size(2) for m in reference[0]], name
            assert sum(m.size(2) for m in mels) == cfg.flow.token_mel_ratio * n_tokens, name
            assert sum(a.size for a in audio) == full_len, name
            for k, (got, ref) in enumerate(zip(mels, reference[0])):
                assert_close(got, ref, TOL, f"{name}: mel of chunk {k}")
            for k, (got, ref) in enumerate(zip(audio, reference[1])):
                assert_close(got, ref, TOL_AUDIO, f"{name}: audio of chunk {k}")
        assert Token2Wav(model).full(torch.tensor([ids]), prompt).size == full_len


def test_a_short_first_hop_streams_the_recomputing_engine(engine_model):
    """``first_hop_len`` shorter than the flow's chunk, off the grid: the first chunk's frames come from a partial
    attention chunk, recomputed with the second push; chunk for chunk the recomputing engine's mel and audio, and
    every sample of the non-streaming path."""
    model, cfg = engine_model, engine_model.config
    chunk, n_tokens = cfg.flow.encoder.static_chunk_size, 40
    prompt = voice(model, chunk + 2, seed=9)
    ids = torch.randint(0, cfg.flow.vocab_size, (n_tokens,), generator=torch.Generator().manual_seed(7)).tolist()
    bursts, ahead = [1] * n_tokens, [k % 3 == 0 for k in range(n_tokens)]
    base = dict(token_hop_len=chunk, token_max_hop_len=4 * chunk, first_hop_len=max(1, chunk // 2))
    reference = engine_stream(model, prompt, ids, StreamSchedule(incremental=False, **base), bursts, ahead)
    assert reference[0][0].size(2) == cfg.flow.token_mel_ratio * base["first_hop_len"]
    mels, audio = engine_stream(model, prompt, ids, StreamSchedule(**base), bursts, ahead)
    assert [m.size(2) for m in mels] == [m.size(2) for m in reference[0]]
    assert sum(a.size for a in audio) == Token2Wav(model).hop * n_tokens
    for k, (got, ref) in enumerate(zip(mels, reference[0])):
        assert_close(got, ref, TOL, f"mel of chunk {k}")
    for k, (got, ref) in enumerate(zip(audio, reference[1])):
        assert_close(got, ref, TOL_AUDIO, f"audio of chunk {k}")


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_engine_streams_at_a_flow_speaking_rate(engine_model, speed):
    """``speed_method="flow"``: the incremental engine streams the recomputing engine's chunks (flow ahead asked for
    at random moments: it does not run at a flow rate), with and without dropping its cache after the first chunk;
    its frames and samples add up to the non-streaming ``Token2Wav.full`` at that speed."""
    model, cfg = engine_model, engine_model.config
    chunk, n_tokens = cfg.flow.encoder.static_chunk_size, 40
    rng = random.Random(int(speed * 10))
    prompt = voice(model, chunk + 2, seed=3)
    ids = torch.randint(0, cfg.flow.vocab_size, (n_tokens,), generator=torch.Generator().manual_seed(6)).tolist()
    bursts = []
    while sum(bursts) < n_tokens:
        bursts.append(rng.choice([1, 2, chunk, 3 * chunk]))
    ahead = [rng.random() < 0.5 for _ in bursts]
    base = dict(token_hop_len=chunk, token_max_hop_len=4 * chunk, speed_method="flow")
    reference = engine_stream(model, prompt, ids, StreamSchedule(incremental=False, **base), bursts, ahead,
                              speed=speed)
    whole = Token2Wav(model, StreamSchedule(**base)).full(torch.tensor([ids]), prompt, speed=speed)
    frames = FrameRate(speed, prompt.prompt_mel.size(1)).total(prompt.prompt_mel.size(1) + cfg.flow.token_mel_ratio
                                                               * n_tokens) - prompt.prompt_mel.size(1)
    assert whole.size == frames * cfg.hift.hop_length
    for schedule in (StreamSchedule(**base), StreamSchedule(flow_cache_limit_mb=0, **base)):
        mels, audio = engine_stream(model, prompt, ids, schedule, bursts, ahead, speed=speed)
        name = f"speed {speed}, cache limit {schedule.flow_cache_limit_mb}"
        assert [m.size(2) for m in mels] == [m.size(2) for m in reference[0]], name
        assert sum(m.size(2) for m in mels) == frames, name
        assert sum(a.size for a in audio) == whole.size, name
        for k, (got, ref) in enumerate(zip(mels, reference[0])):
            assert_close(got, ref, TOL, f"{name}: mel of chunk {k}")
