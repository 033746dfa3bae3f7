"""CosyVoice 2 text-speech LM: parity with the reference ``Qwen2LM`` on ``lm_cases.npz`` (docs/design.md, "CosyVoice 2 LM sequence layouts").

Every seed, length and id comes from the fixture folder (``manifest.json:info``) or the config, so the tests also
run on other fixture sets with the same layout.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from cadenza.layers.kv_cache import KVCache
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.lm import TIED_LM_HEAD_KEY, TextSpeechLM, drop_tied_lm_head
from cadenza.models.cosyvoice2.sampling import RasSampler, nucleus_size, ras_sampling, top_probabilities
from helpers import assert_close

ATOL = 1e-4
GREEDY_CASES = {  # name -> (prompt text array, prompt speech array); None = empty prompt part
    "icl": ("prompt_text", "prompt_speech_token"),
    "crosslingual": (None, None),
    "instruct2": ("instruct_text", None),
}


@pytest.fixture(scope="module")
def cfg(cv2_dir):
    return CosyVoice2Config.from_files(cv2_dir / "config.yaml", cv2_dir / "CosyVoice-BlankEN" / "config.json")


@pytest.fixture(scope="module")
def checkpoint(cv2_dir):
    return torch.load(cv2_dir / "llm.pt", map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def lm(cfg, checkpoint):
    model = TextSpeechLM(cfg.lm).eval()
    model.load_state_dict(drop_tied_lm_head(checkpoint), strict=True)
    return model


@pytest.fixture(scope="module")
def cases(cv2_npz):
    return {k: torch.from_numpy(v) for k, v in cv2_npz("lm_cases").items()}


@pytest.fixture(scope="module")
def info(cv2_manifest):
    return cv2_manifest["info"]


def assert_scores_close(recorded: list[torch.Tensor], expected: torch.Tensor, name: str) -> None:
    """Sampler inputs vs reference: same -inf (masked) entries, finite entries within ATOL."""
    actual = torch.stack(recorded).numpy()
    expected = expected.numpy()
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    masked = np.isneginf(expected)
    assert (np.isneginf(actual) == masked).all(), f"{name}: masked (-inf) entries differ"
    assert_close(np.where(masked, 0.0, actual), np.where(masked, 0.0, expected), ATOL, name)


def argmax_sampler(num_speech_tokens: int, record: list[torch.Tensor]):
    """The fixtures' deterministic rule: argmax over speech ids and eos (the two special ids never win)."""

    def sample(logp: torch.Tensor, history) -> int:
        record.append(logp.clone())
        return int(torch.argmax(logp[: num_speech_tokens + 1]))

    return sample


def optional(cases, name):
    return None if name is None else cases[name]


# ---- structure ---------------------------------------------------------------------------------------------------
def test_state_dict_keys_equal_checkpoint_minus_tied_head(lm, checkpoint):
    assert set(lm.state_dict()) == set(checkpoint) - {TIED_LM_HEAD_KEY}
    # the dropped tensor really is the tied copy of the text embedding
    assert torch.equal(checkpoint[TIED_LM_HEAD_KEY], checkpoint["llm.model.model.embed_tokens.weight"])
    assert not list(lm.buffers()), "no buffers: the state dict holds parameters only"


def test_full_size_structure_on_meta():
    with torch.device("meta"):
        model = TextSpeechLM(CosyVoice2Config.official().lm)
    sd = model.state_dict()
    assert len(sd) == 294  # llm.pt has 295 keys: + the tied llm.model.lm_head.weight
    assert TIED_LM_HEAD_KEY not in sd
    assert sum(p.numel() for p in model.parameters()) == 505_803_812  # unique params (docs/design.md, "CosyVoice 2 release files and loading"), lm_head tied
    shapes = {
        "llm.model.model.layers.23.self_attn.k_proj.weight": (128, 896),
        "llm.model.model.layers.23.self_attn.o_proj.weight": (896, 896),
        "llm.model.model.layers.23.mlp.down_proj.weight": (896, 4864),
        "llm_decoder.weight": (6564, 896),
        "llm_decoder.bias": (6564,),
        "speech_embedding.weight": (6564, 896),
        "llm_embedding.weight": (2, 896),
        "llm.model.model.embed_tokens.weight": (151936, 896),
        "llm.model.model.norm.weight": (896,),
    }
    for key, shape in shapes.items():
        assert tuple(sd[key].shape) == shape, key
    assert "llm.model.model.layers.0.self_attn.o_proj.bias" not in sd


# ---- teacher-forced parity ---------------------------------------------------------------------------------------
def test_teacher_forced_parity(lm, cases):
    speech = torch.cat([cases["prompt_speech_token"], cases["target_speech_token"]], dim=1)
    with torch.no_grad():
        embeds = lm.build_input(cases["text"], cases["prompt_text"], speech)
        assert_close(embeds, cases["lm_input"], ATOL, "lm_input")
        task_pos = int(cases["task_id_position"])
        assert torch.equal(embeds[0, task_pos], lm.llm_embedding.weight[1])
        hidden = lm.forward_hidden(embeds)
        assert_close(hidden, cases["hidden"], ATOL, "hidden")
        logits = lm.logits(hidden)
        assert_close(logits, cases["logits"], ATOL, "logits")
        assert_close(lm.log_probs(hidden), cases["logp"], ATOL, "logp")


def test_cached_chunks_equal_full_forward(lm, cases):
    """Appending several tokens to a non-empty cache must use the offset causal mask."""
    embeds = cases["lm_input"]
    with torch.no_grad():
        full = lm.forward_hidden(embeds)
        cache = lm.new_cache()
        bounds = [0, 7, 8, 13, 30, 31, embeds.shape[1]]
        parts = [lm.forward_hidden(embeds[:, a:b], cache=cache) for a, b in itertools.pairwise(bounds)]
    assert cache.length == embeds.shape[1]
    assert_close(torch.cat(parts, dim=1), full, 1e-5, "chunked vs full")


# ---- decoding ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(GREEDY_CASES))
def test_greedy_decode(lm, cfg, cases, case):
    prompt_text, prompt_speech = GREEDY_CASES[case]
    expected = cases[f"{case}_greedy_tokens"]
    recorded: list[torch.Tensor] = []
    gen = lm.generate(cases["text"], optional(cases, prompt_text), optional(cases, prompt_speech),
                      sampler=argmax_sampler(cfg.lm.speech_token_size, recorded))
    tokens = list(itertools.islice(gen, len(expected)))
    gen.close()
    assert tokens == expected.tolist()
    assert_scores_close(recorded, cases[f"{case}_greedy_step_scores"], f"{case}_greedy_step_scores")


def test_ras_decode_with_generator(lm, cases, info):
    seed = info["seeds"]["icl_ras_decode"]
    expected = cases["icl_ras_seed1234_tokens"]
    ras = RasSampler(lm.cfg.sampling, torch.Generator().manual_seed(seed))
    recorded: list[torch.Tensor] = []

    def sampler(logp, history):
        recorded.append(logp.clone())
        return ras(logp, history)

    gen = lm.generate(cases["text"], cases["prompt_text"], cases["prompt_speech_token"], sampler=sampler)
    assert list(itertools.islice(gen, len(expected))) == expected.tolist()
    gen.close()
    assert_scores_close(recorded, cases["icl_ras_step_scores"], "icl_ras_step_scores")
    # the default sampler is RAS with the given generator
    gen = lm.generate(cases["text"], cases["prompt_text"], cases["prompt_speech_token"],
                      generator=torch.Generator().manual_seed(seed))
    assert list(itertools.islice(gen, len(expected))) == expected.tolist()
    gen.close()


def test_ras_unit_cases(lm, cases, info):
    seeds = info["seeds"]["ras_unit"]
    scores, history, out = cases["ras_unit_scores"], cases["ras_unit_history"], cases["ras_unit_out"]
    assert len(seeds) == scores.shape[0] == history.shape[0] == out.shape[0]
    for i, seed in enumerate(seeds):
        got = ras_sampling(scores[i].clone(), history[i].tolist(), lm.cfg.sampling, torch.Generator().manual_seed(seed))
        assert got == int(out[i]), f"case {i}"
        # the global RNG path (generator=None) after torch.manual_seed gives the same draw
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            assert ras_sampling(scores[i].clone(), history[i], lm.cfg.sampling) == int(out[i]), f"case {i} (global)"


def test_seeded_generator_matches_global_rng(info):
    seed = info["seeds"]["icl_ras_decode"]
    weights = torch.rand(50, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    ours = [int(torch.multinomial(weights[: 5 + k], 1, replacement=True, generator=g)) for k in range(40)]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        ref = [int(torch.multinomial(weights[: 5 + k], 1, replacement=True)) for k in range(40)]
    assert ours == ref


def test_eos_masked_before_min_len_and_max_len(lm, cases):
    eos, min_len = lm.eos_id, int(cases["text"].shape[1] * lm.cfg.min_token_text_ratio)

    def eos_when_allowed(logp, history):
        return eos if torch.isfinite(logp[eos]) else int(torch.argmax(logp[:eos]))

    assert len(list(lm.generate(cases["text"], sampler=eos_when_allowed))) == min_len
    never_eos = argmax_sampler(lm.cfg.speech_token_size - 1, [])
    assert len(list(lm.generate(cases["text"], sampler=never_eos, min_len=0, max_len=min_len + 3))) == min_len + 3


def bistream_sampler(lm, force_eos_at: int, recorded: list[torch.Tensor]):
    """Argmax rule; from sampler call ``force_eos_at`` on, eos whenever it is not masked."""
    argmax = argmax_sampler(lm.cfg.speech_token_size, recorded)

    def sample(logp, history):
        call = len(recorded)
        token = argmax(logp, history)
        return lm.eos_id if call >= force_eos_at and torch.isfinite(logp[lm.eos_id]) else token

    return sample


def run_bistream(lm, cases, info, **kwargs):
    text = cases["bistream_text"]
    recorded: list[torch.Tensor] = []
    log: list[list[int]] = []
    tokens = list(lm.generate_bistream(
        (text[:, i : i + 1] for i in range(text.shape[1])), cases["prompt_text"], cases["prompt_speech_token"],
        sampler=bistream_sampler(lm, info["seeds"]["bistream_force_eos_at"], recorded), step_log=log, **kwargs,
    ))
    return tokens, recorded, log


def test_bistream_parity(lm, cases, info):
    tokens, recorded, log = run_bistream(lm, cases, info)
    assert tokens == cases["bistream_greedy_tokens"].tolist()
    assert len(recorded) == info["bistream_n_sampler_calls"]
    assert_scores_close(recorded, cases["bistream_step_scores"], "bistream_step_scores")
    assert log == info["bistream_forward_one_step_log"]


def test_bistream_without_reference_quirks_feeds_no_duplicate(lm, cases, info):
    ref_log = info["bistream_forward_one_step_log"]
    _, _, log = run_bistream(lm, cases, info, reference_quirks=False)
    k = next((i for i, (a, b) in enumerate(zip(log, ref_log)) if a != b), None)
    if k is None:  # this fixture's text phase did not end on a fill: nothing is duplicated
        assert log == ref_log
        return
    assert log[:k] == ref_log[:k]
    new, past, total = ref_log[k]
    assert log[k] == [new - 1, past, total - 1]  # the cached speech embedding is not fed again
    assert log[k + 1 :] == [[n, p - 1, t - 1] for n, p, t in ref_log[k + 1 :]]


def test_bistream_final_phase_has_max_len(lm, cases, info):
    n_text = cases["bistream_text"].shape[1]
    max_len = len(cases["bistream_greedy_tokens"]) + 2
    text = cases["bistream_text"]
    never_eos = argmax_sampler(lm.cfg.speech_token_size - 1, [])
    chunks = (text[:, i : i + 1] for i in range(n_text))
    tokens = list(lm.generate_bistream(chunks, cases["prompt_text"], cases["prompt_speech_token"],
                                       sampler=never_eos, max_len=max_len))
    assert len(tokens) == max_len


# ---- KV cache ----------------------------------------------------------------------------------------------------
def test_kv_cache_append_grow_crop_free():
    cache = KVCache(num_layers=2, capacity=3)
    k = torch.arange(2 * 2 * 4 * 5, dtype=torch.float32).reshape(2, 2, 4, 5)
    for layer in range(2):
        keys, values = cache.append(layer, k[:, :, :2], -k[:, :, :2])
        assert keys.shape == (2, 2, 2, 5) and torch.equal(values, -k[:, :, :2])
    assert cache.length == 2 and cache.capacity == 3
    keys, _ = cache.append(0, k[:, :, 2:], -k[:, :, 2:])  # grows past the reserved capacity
    assert torch.equal(keys, k) and cache.layer_length(0) == 4 and cache.capacity >= 4
    cache.crop(1)
    assert cache.length == 1 and cache.layer_length(1) == 1 and torch.equal(cache.keys(0), k[:, :, :1])
    cache.free()
    assert cache.length == 0 and cache.keys(0) is None and cache.nbytes == 0


def _nucleus_size_loop(head: torch.Tensor, top_p: float) -> int:
    """The reference's loop: running sum in the tensor's dtype, first entry always taken."""
    cum, count = torch.zeros((), dtype=head.dtype), 0
    for value in head:
        if count > 0 and not bool(cum < top_p):
            break
        cum, count = cum + value, count + 1
    return count


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_nucleus_size_equals_the_reference_loop(dtype):
    """Random, peaked and boundary cases (a running sum that lands exactly on top_p; ties; one entry)."""
    gen = torch.Generator().manual_seed(0)
    cases = []
    for _ in range(300):
        logits = torch.randn(6564, generator=gen) * float(torch.rand((), generator=gen) * 8)
        cases.append(logits.softmax(0).sort(descending=True, stable=True)[0][:25])
    cases += [torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.25] * 4), torch.tensor([1.0]), torch.tensor([0.8, 0.2]),
              torch.tensor([0.4, 0.4, 0.1, 0.1])]
    for top_p in (0.8, 0.5, 0.95):
        for head in cases:
            head = head.to(dtype)
            assert nucleus_size(head, top_p) == _nucleus_size_loop(head, top_p), (head[:5], top_p)


def test_top_probabilities_equal_the_stable_full_sort():
    """The top-k shortcut gives the values and ids of the stable descending sort, ties included (inside the k, and
    across the k-th place, where it falls back to the full sort)."""
    gen = torch.Generator().manual_seed(0)
    cases = [torch.randn(6564, generator=gen).mul(s).softmax(0) for s in (0.5, 3.0, 10.0)]
    tied = torch.randn(6564, generator=gen).round().softmax(0)  # few distinct values: ties everywhere
    cases += [tied, torch.full((50,), 0.02), torch.tensor([0.3, 0.2, 0.2, 0.2, 0.1]), torch.tensor([0.7, 0.3])]
    spiky = torch.zeros(6564)
    spiky[[7, 3000, 12]] = torch.tensor([0.5, 0.25, 0.25])
    cases.append(spiky)
    for probs in cases:
        expected_values, expected_ids = probs.sort(descending=True, stable=True)
        for k in (1, 3, 25, probs.numel(), probs.numel() + 5):
            values, ids = top_probabilities(probs, k)
            assert torch.equal(ids, expected_ids[:k]), (k, ids[:8], expected_ids[:8])
            assert torch.equal(values, expected_values[:k])


def test_bistream_never_fails_on_a_special_id_drawn_in_the_wrong_phase(lm, cases, info):
    """The reference raises when a sample lands on a special id its phase cannot use (the unused id anywhere, eos
    before the text ends is masked already): we draw again without it, so a valid request never fails mid-stream."""
    unused = lm.cfg.speech_token_size + 1
    assert unused not in (lm.eos_id, lm.fill_id)
    draws: list[int] = []

    def unlucky(logp, history):  # always the unused id while it is allowed; else a speech token, eos after 30
        token = (unused if torch.isfinite(logp[unused]) else lm.eos_id if len(history) > 30 and
                 torch.isfinite(logp[lm.eos_id]) else int(torch.argmax(logp[: lm.cfg.speech_token_size])))
        draws.append(token)
        return token

    text = cases["bistream_text"]
    tokens = list(lm.generate_bistream((text[:, i : i + 1] for i in range(text.shape[1])), cases["prompt_text"],
                                       cases["prompt_speech_token"], sampler=unlucky))
    assert tokens and all(0 <= t < lm.cfg.speech_token_size for t in tokens)
    assert draws.count(unused) >= 2  # it was drawn (in both phases) and replaced each time


def test_unistream_draws_again_when_fill_or_unused_is_sampled(lm, cases):
    """The whole text is given, so fill (bistream's "more text, please") or the unused id ends nothing: the reference
    stops there, cutting the sentence short; we draw again without them (and only then: every other draw is the
    reference's)."""
    fill, unused, eos = lm.fill_id, lm.cfg.speech_token_size + 1, lm.eos_id
    draws: list[int] = []

    def unlucky(logp, history):  # fill at the 4th token, unused at the 7th, eos after 12, else the best speech token
        token = int(torch.argmax(logp[: lm.cfg.speech_token_size]))
        if len(history) == 3 and torch.isfinite(logp[fill]):
            token = fill
        elif len(history) == 6 and torch.isfinite(logp[unused]):
            token = unused
        elif len(history) >= 12 and torch.isfinite(logp[eos]):
            token = eos
        draws.append(token)
        return token

    tokens = list(lm.generate(cases["text"], sampler=unlucky, min_len=0, max_len=40))
    assert len(tokens) == 12 and all(0 <= t < lm.cfg.speech_token_size for t in tokens)
    assert draws.count(fill) == 1 and draws.count(unused) == 1 and draws[-1] == eos
    assert len(draws) == 12 + 2 + 1  # one draw again for each of the two, then eos
