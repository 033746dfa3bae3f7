"""VoxCPM 2 generation against the ``gen_<mode>.safetensors`` / ``stream_<mode>.safetensors`` fixtures (README §5-§6),
plus layouts, the tokenizer cases of ``manifest.tokenizer`` and the always-on text clean-up.

Each run replays the fixture's noise (or draws it from a private generator seeded with the manifest seed) and
checks every captured intermediate. Tolerances (fixture README): 1e-4 for stacks, 2e-3 for whole generations.
The AudioVAE is not used here: ``wav_out`` is the decoder's job; latents and context are compared instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cadenza.errors import InputError, TextError
from cadenza.models.voxcpm2.generate import GenerationOptions, generate_latents, iter_patches, length_cap
from cadenza.models.voxcpm2.layouts import (
    SequenceLayout,
    VoicePrompt,
    build_layout,
    latents_to_patches,
    layout_text,
    make_layout,
    patches_to_latents,
)
from cadenza.models.voxcpm2.loader import load_model
from cadenza.models.voxcpm2.text import clean_text
from cadenza.models.voxcpm2.tokenizer import VoxCPM2Tokenizer
from helpers import assert_close, vx2_fixture_dir

REPO_ROOT = Path(__file__).resolve().parents[3]
STACK_TOL = 1e-4
GEN_TOL = 2e-3


@pytest.fixture(scope="module")
def audio_vae(vx2_dir: Path):
    from cadenza.models.voxcpm2.audio_vae_loader import load_audio_vae

    return load_audio_vae(vx2_dir / "tiny_model")


@pytest.fixture(scope="module")
def tokenizer(vx2_dir: Path) -> VoxCPM2Tokenizer:
    return VoxCPM2Tokenizer(vx2_dir / "tiny_model")


def _load(vx2_dir: Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(vx2_dir / name))


def _generation_modes() -> list[str]:
    """Modes with a ``gen_<mode>.safetensors`` file and a manifest entry (empty when the fixtures are absent)."""
    path = vx2_fixture_dir()
    if not (path / "manifest.json").is_file():
        return []
    cases = json.loads((path / "manifest.json").read_text())["generation"]
    return sorted(m for m in (p.stem.removeprefix("gen_") for p in path.glob("gen_*.safetensors")) if m in cases)


GEN_MODES = _generation_modes()
TEXT_ONLY_MODES = [m for m in GEN_MODES if not m.endswith("continuation")]  # no prompt text needed


def _layout(g: dict[str, torch.Tensor]) -> SequenceLayout:
    return SequenceLayout(g["seq_text_token"][0], g["seq_text_mask"][0], g["seq_audio_feat"][0], g["seq_audio_mask"][0])


def _options(case: dict) -> GenerationOptions:
    kw = case["inference_kwargs"]
    return GenerationOptions(
        min_len=kw["min_len"], max_len=kw["max_len"], inference_timesteps=kw["inference_timesteps"],
        cfg_value=kw["cfg_value"], context_patches=kw["streaming_prefix_len"] - 1,
    )


class Recorder:
    """Forward hooks that keep every call's inputs/outputs of a module."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls: list[tuple[tuple, torch.Tensor]] = []
        self._handle = module.register_forward_hook(lambda _m, args, out: self.calls.append((args, out)))

    def remove(self) -> None:
        self._handle.remove()


@pytest.mark.parametrize("mode", GEN_MODES)
def test_generation_replayed_noise(vx2_model, vx2_dir, vx2_manifest, mode):
    g, case = _load(vx2_dir, f"gen_{mode}.safetensors"), vx2_manifest["generation"][mode]
    layout = _layout(g)
    recorders = {name: Recorder(getattr(vx2_model, name)) for name in ("feat_encoder", "base_lm", "residual_lm")}
    recorders["estimator"] = Recorder(vx2_model.feat_decoder.estimator)
    steps = []
    try:
        result = generate_latents(vx2_model, layout, _options(case), noise=g["noise"], on_step=steps.append)
    finally:
        for r in recorders.values():
            r.remove()

    n = case["n_patches"]
    assert result.patches.shape[0] == n == g["generated_feat"].shape[0]
    assert result.stopped == case["stopped_by_stop_head"]
    assert [int(s.stop_logits.argmax()) for s in steps] == case["stop_flags"]
    # prefill: first call of each stack
    assert_close(recorders["feat_encoder"].calls[0][1], g["prefill_locenc_out"], STACK_TOL, "prefill LocEnc")
    assert_close(recorders["base_lm"].calls[0][1], g["prefill_base_lm_out"], STACK_TOL, "prefill TSLM")
    assert_close(recorders["residual_lm"].calls[0][1], g["prefill_residual_lm_out"], STACK_TOL, "prefill RALM")
    # per step
    assert_close(torch.cat([s.lm_hidden for s in steps]), g["step_lm_hidden"], GEN_TOL, "step lm_hidden")
    assert_close(torch.cat([s.residual_hidden for s in steps]), g["step_residual_hidden"], GEN_TOL, "step res_hidden")
    assert_close(result.stop_logits, g["step_stop_logits"], GEN_TOL, "stop logits")
    assert_close(torch.stack([s.patch for s in steps]), g["step_patch"], GEN_TOL, "step patches")
    # LocEnc of every generated patch but the last (the reference also embeds the last one; it is never used)
    step_enc = torch.cat([out for _, out in recorders["feat_encoder"].calls[1:]], dim=1)
    assert step_enc.shape[1] == n - 1
    assert_close(step_enc, g["step_locenc_out"][:, : n - 1], GEN_TOL, "step LocEnc")
    assert_close(result.patches, g["generated_feat"], GEN_TOL, "generated_feat")
    # the estimator calls of patch 0 (CFG batch: row 0 conditional, row 1 mu = 0)
    n_calls = g["patch0_est_out"].shape[0]
    assert case["estimator_calls_per_patch"] == n_calls
    assert len(recorders["estimator"].calls) == n_calls * n
    calls = recorders["estimator"].calls[:n_calls]
    for i, name in enumerate(("x", "mu", "t", "cond")):
        got = torch.stack([args[i] for args, _ in calls])
        assert_close(got, g[f"patch0_est_{name}"], STACK_TOL, f"patch0 estimator {name}")
    assert_close(torch.stack([out for _, out in calls]), g["patch0_est_out"], STACK_TOL, "patch0 estimator out")
    # latents handed to the decoder: context (continuation modes) + generated patches
    context = layout.context_patches(_options(case).context_patches)
    assert result.context_len == (context.shape[0] if layout.ends_with_audio else 0)
    if layout.ends_with_audio:
        expected_ctx = g["seq_audio_feat"][0][g["seq_audio_mask"][0].bool()][-result.context_len:]
        assert torch.equal(result.context, expected_ctx)
    lat = result.latents
    assert lat.shape == (1, vx2_model.feat_dim, (result.context_len + n) * vx2_model.patch_size)
    assert_close(latents_to_patches(lat, vx2_model.patch_size)[result.context_len:], g["generated_feat"], GEN_TOL, "latents")
    assert g["wav_out"].shape[-1] == case["wav_samples"]


@pytest.mark.parametrize("mode", GEN_MODES)
def test_waveform_through_audio_vae(vx2_model, audio_vae, vx2_dir, vx2_manifest, mode):
    """End to end: generated latents (+ continuation context) decoded by the AudioVAE, context samples dropped."""
    g, case, vae = _load(vx2_dir, f"gen_{mode}.safetensors"), vx2_manifest["generation"][mode], audio_vae
    result = generate_latents(vx2_model, _layout(g), _options(case), noise=g["noise"])
    with torch.no_grad():
        wav = vae.decode(result.latents)
    wav = wav[..., result.context_len * vx2_model.patch_size * vae.decode_hop_length:].reshape(1, -1)
    assert wav.shape[-1] == case["wav_samples"]
    assert_close(wav, g["wav_out"], GEN_TOL, f"{mode} waveform")


@pytest.mark.parametrize("mode", GEN_MODES)
def test_generation_seeded_generator_matches_reference_seed(vx2_model, vx2_dir, vx2_manifest, mode):
    """A private generator seeded like the reference's global RNG draws the same noise (and thus the same audio)."""
    g, case = _load(vx2_dir, f"gen_{mode}.safetensors"), vx2_manifest["generation"][mode]
    gen = torch.Generator().manual_seed(case["seed"])
    state = torch.random.get_rng_state()
    drawn = []
    replay = generate_latents(vx2_model, _layout(g), _options(case), noise=gen, on_step=drawn.append)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG was not touched
    assert_close(replay.patches, g["generated_feat"], GEN_TOL, "generator run")
    check = torch.Generator().manual_seed(case["seed"])
    expected_noise = torch.stack([torch.randn(tuple(g["noise"].shape[1:]), generator=check) for _ in drawn])
    assert torch.equal(expected_noise, g["noise"])


@pytest.mark.parametrize("name", ["stream_zero_shot", "stream_continuation"])
def test_streaming_fixture_patches(vx2_model, vx2_dir, vx2_manifest, name):
    """The step generator yields exactly the reference's streaming patches, one per step."""
    path = vx2_dir / f"{name}.safetensors"
    assert path.is_file(), f"the VoxCPM 2 fixture lacks {path.name}"
    s, case = _load(vx2_dir, path.name), vx2_manifest["generation"][name]
    base = name.removeprefix("stream_")  # the non-streaming run with the same text, prompt and seed
    g = _load(vx2_dir, f"gen_{base}.safetensors")
    assert case["target_text"] == vx2_manifest["generation"][base]["target_text"]
    assert case["seed"] == vx2_manifest["generation"][base]["seed"]
    steps = list(iter_patches(vx2_model, _layout(g), _options(case), noise=s["noise"]))
    assert len(steps) == case["n_patches"] == s["step_patch"].shape[0]
    assert_close(torch.stack([st.patch for st in steps]), s["step_patch"], GEN_TOL, f"{name} patches")
    assert_close(torch.cat([st.stop_logits for st in steps]), s["step_stop_logits"], GEN_TOL, f"{name} stop")
    assert steps[-1].is_last and not any(st.is_last for st in steps[:-1])


def test_max_len_caps_generation(vx2_model, vx2_dir, vx2_manifest):
    mode = GEN_MODES[0]
    g, case = _load(vx2_dir, f"gen_{mode}.safetensors"), vx2_manifest["generation"][mode]
    cap = min(case["n_patches"] - 1, case["inference_kwargs"]["min_len"] + 1)
    opts = GenerationOptions(**{**_options(case).__dict__, "max_len": cap})
    result = generate_latents(vx2_model, _layout(g), opts, noise=g["noise"])
    assert result.patches.shape[0] == cap and not result.stopped
    assert_close(result.patches, g["generated_feat"][:cap], GEN_TOL, "capped run")


def test_replayed_noise_exhausted_is_an_error(vx2_model, vx2_dir, vx2_manifest):
    mode = GEN_MODES[0]
    g, case = _load(vx2_dir, f"gen_{mode}.safetensors"), vx2_manifest["generation"][mode]
    with pytest.raises(InputError, match="replayed noise"):
        generate_latents(vx2_model, _layout(g), _options(case), noise=g["noise"][:1])


def test_prompt_longer_than_cache_is_rejected(vx2_model):
    layout = build_layout([1] * vx2_model.config.max_length, vx2_model.patch_size, vx2_model.feat_dim)
    with pytest.raises(TextError, match="positions"):
        next(iter_patches(vx2_model, layout, noise=torch.Generator().manual_seed(0)))


def test_generation_near_cache_capacity_stops_at_capacity(vx2_model, caplog):
    # a prompt leaving room for 2 positions: patch 0 (prefill state) + 2 fed patches -> at most 3 patches
    capacity = vx2_model.config.max_length
    layout = build_layout([1] * (capacity - 3), vx2_model.patch_size, vx2_model.feat_dim)
    assert len(layout) == capacity - 2
    opts = GenerationOptions(min_len=100, max_len=50)
    with caplog.at_level("WARNING"):
        steps = list(iter_patches(vx2_model, layout, opts, noise=torch.Generator().manual_seed(0)))
    assert len(steps) == 3 and steps[-1].is_last and not steps[-1].stopped
    assert "KV cache" in caplog.text


# --- layouts -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", GEN_MODES)
def test_layout_matches_reference(vx2_model, vx2_dir, vx2_manifest, tokenizer, mode):
    g, case = _load(vx2_dir, f"gen_{mode}.safetensors"), vx2_manifest["generation"][mode]
    special = vx2_model.config.special_tokens
    assert tokenizer.encode(case["target_text"]) == case["target_text_token_ids"]
    ref, prompt = g.get("cache_ref_audio_feat"), g.get("cache_prompt_audio_feat")
    tokens, tmask = g["seq_text_token"][0], g["seq_text_mask"][0].bool()
    text_ids = [int(t) for t in tokens[tmask]]
    if ref is not None:  # 103 ... 104 around the reference
        assert text_ids[:2] == [special.ref_audio_start, special.ref_audio_end]
        text_ids = text_ids[2:]
    assert text_ids[-1] == special.audio_start
    text_ids = text_ids[:-1]
    if prompt is None:  # the text path gives the same ids (continuation texts are prompt + target)
        assert text_ids == tokenizer.encode(case["target_text"])
    layout = build_layout(text_ids, vx2_model.patch_size, vx2_model.feat_dim, ref, prompt, special)
    expected = _layout(g)
    for field in ("text_tokens", "text_mask", "audio_feat", "audio_mask"):
        got, want = getattr(layout, field), getattr(expected, field)
        assert got.dtype == want.dtype and torch.equal(got, want), field
    assert case.get("cache_mode", "zero_shot") == (
        VoicePrompt(ref, "p" if prompt is not None else None, prompt).mode if (ref is not None or prompt is not None)
        else "zero_shot")


@pytest.mark.parametrize("mode", TEXT_ONLY_MODES)
def test_text_path_layout(vx2_model, vx2_dir, vx2_manifest, tokenizer, mode):
    """Modes without a continuation prompt (whose text the manifest does not record): text -> layout equals the
    reference's ``_inference`` arguments."""
    g, case = _load(vx2_dir, f"gen_{mode}.safetensors"), vx2_manifest["generation"][mode]
    assert "cache_prompt_audio_feat" not in g
    ref = g.get("cache_ref_audio_feat")
    prompt = VoicePrompt(ref_patches=ref) if ref is not None else None
    layout, target_len = make_layout(tokenizer, vx2_model.config, case["target_text"], prompt)
    assert target_len == len(case["target_text_token_ids"])
    expected = _layout(g)
    for field in ("text_tokens", "text_mask", "audio_feat", "audio_mask"):
        assert torch.equal(getattr(layout, field), getattr(expected, field)), field


def test_voice_prompt_rules_and_merge(vx2_model):
    p, d = vx2_model.patch_size, vx2_model.feat_dim
    ref, prompt, new = torch.ones(2, p, d), torch.full((3, p, d), 2.0), torch.full((4, p, d), 3.0)
    with pytest.raises(InputError):
        VoicePrompt(prompt_text="hi")  # text without audio
    with pytest.raises(InputError):
        VoicePrompt()  # nothing
    cont = VoicePrompt(prompt_text="Hello.", prompt_patches=prompt)
    assert cont.mode == "continuation" and layout_text("World.", cont) == "Hello.World."
    merged = VoicePrompt(ref_patches=ref).merged("Next.", new)
    assert merged.mode == "ref_continuation" and merged.prompt_text == "Next." and torch.equal(merged.prompt_patches, new)
    merged2 = cont.merged(" More.", new)
    assert merged2.prompt_text == "Hello. More." and merged2.prompt_patches.shape[0] == 7
    assert layout_text("x", None) == "x" and layout_text("x", VoicePrompt(ref_patches=ref)) == "x"


def test_latent_patch_reshapes_are_inverse(vx2_model):
    p, d = vx2_model.patch_size, vx2_model.feat_dim
    lat = torch.arange(d * 3 * p, dtype=torch.float32).reshape(1, d, 3 * p)
    patches = latents_to_patches(lat, p)
    assert patches.shape == (3, p, d)
    assert torch.equal(patches[1, 2], lat[0, :, 1 * p + 2])  # frame P·j + slot -> patch j, slot
    assert torch.equal(patches_to_latents(patches), lat)
    with pytest.raises(InputError):
        latents_to_patches(lat[..., :-1], p)


# --- tokenizer and text ----------------------------------------------------------------------------------------

def test_tokenizer_cases(tokenizer, vx2_manifest):
    assert vx2_manifest["tokenizer"]
    for text, case in vx2_manifest["tokenizer"].items():
        assert tokenizer.base_tokenize(text) == case["base_tokenize"], text
        assert tokenizer.tokenize(text) == case["wrapped_tokenize"], text
        assert tokenizer.encode(text) == case["ids"], text


def _tokenizer_without_bytes(vx2_dir: Path, tmp_path: Path) -> Path:
    """The fixture tokenizer minus its byte-fallback tokens, so some characters are truly unknown."""
    data = json.loads((vx2_dir / "tiny_model" / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    data["model"]["vocab"] = {t: i for t, i in vocab.items() if not (t.startswith("<0x") and t.endswith(">"))}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_bytes((vx2_dir / "tiny_model" / "tokenizer_config.json").read_bytes())
    return tmp_path


def test_unknown_characters_are_never_dropped(vx2_dir, tmp_path, caplog):
    d = _tokenizer_without_bytes(vx2_dir, tmp_path)
    tok = VoxCPM2Tokenizer(d)
    with caplog.at_level("WARNING"):
        ids = tok.encode("a€b")
    # "a" as the text's first word ("▁a", merged or not, depending on the vocabulary), <unk>, then a bare "b"
    assert ids == tok.encode("a") + [tok.unk_id, tok.token_id("b")]
    assert "€" in caplog.text
    with pytest.raises(TextError, match="€"):
        VoxCPM2Tokenizer(d, on_unknown="raise").encode("a€b")


def test_clean_text(vx2_manifest, tokenizer):
    for case in vx2_manifest.get("e2e_retry", {}).values():
        cleaned = clean_text(case["text_in"])
        assert cleaned == case["text_after_core_cleanup"]
        assert len(tokenizer.encode(cleaned)) == case["target_text_len"]
    assert clean_text(" a \n\t b ") == " a b "
    for bad in ("", "  \n ", None):
        with pytest.raises(TextError):
            clean_text(bad)


def test_length_cap(vx2_manifest):
    for case in vx2_manifest.get("e2e_retry", {}).values():
        for attempt in case["attempts"]:
            assert length_cap(case["target_text_len"], 4096, case["ratio_threshold"]) == attempt["max_len"]
    assert length_cap(100, 50) == 50


def test_bf16_code_path_loosely(vx2_dir, vx2_manifest):
    """bf16 (the release dtype): RoPE table, time grid and generator noise are bit-exact; patches agree loosely
    (the reference's own bf16-vs-fp32 difference is ~0.02-0.04, README §10)."""
    path = vx2_dir / "gen_zero_shot_bf16.safetensors"
    if not path.is_file() or "bf16" not in vx2_manifest:
        pytest.skip("no bf16 fixture")
    from cadenza.models.voxcpm2.cfm import time_grid

    b, case = _load(vx2_dir, path.name), vx2_manifest["bf16"]
    g = _load(vx2_dir, "gen_zero_shot.safetensors")
    model = load_model(vx2_dir / "tiny_model", dtype=torch.bfloat16)
    cos, _ = model.base_lm.rope(torch.arange(b["rope_base_cos_bf16"].shape[0]), torch.bfloat16)
    assert torch.equal(cos, b["rope_base_cos_bf16"])
    n_steps = b["t_span_n10_bf16"].numel() - 1
    assert torch.equal(time_grid(n_steps, dtype=torch.bfloat16), b["t_span_n10_bf16"])
    gen = torch.Generator().manual_seed(case["seed"])
    drawn = torch.stack([torch.randn(tuple(b["noise"].shape[1:]), generator=gen, dtype=torch.bfloat16)
                         for _ in range(b["noise"].shape[0])])
    assert torch.equal(drawn, b["noise"])
    steps = list(iter_patches(model, _layout(g), _options(case), noise=b["noise"]))
    assert len(steps) == case["n_patches"]
    got = torch.stack([s.patch for s in steps]).float()
    assert got.dtype == torch.float32 and steps[0].patch.dtype == torch.bfloat16
    assert_close(got, b["step_patch"].float(), 0.1, "bf16 patches (loose)")


def test_layout_validation(vx2_model):
    p, d = vx2_model.patch_size, vx2_model.feat_dim
    ok = build_layout([5, 6], p, d)
    with pytest.raises(InputError, match="exactly one"):
        SequenceLayout(ok.text_tokens, ok.text_mask, ok.audio_feat, ok.text_mask)
    with pytest.raises(InputError, match="audio_feat"):
        SequenceLayout(ok.text_tokens, ok.text_mask, ok.audio_feat[:1], ok.audio_mask)
    with pytest.raises(InputError):
        build_layout([], p, d)
    with pytest.raises(InputError, match="reference patches"):
        build_layout([5], p, d, ref_patches=torch.zeros(2, p + 1, d))


def test_options_validation_and_fresh_noise(vx2_model):
    for bad in ({"max_len": 0}, {"min_len": -1}, {"inference_timesteps": 0}, {"temperature": -1.0}):
        with pytest.raises(InputError):
            GenerationOptions(**bad)
    layout = build_layout([5, 6, 7], vx2_model.patch_size, vx2_model.feat_dim)
    state = torch.random.get_rng_state()
    a = generate_latents(vx2_model, layout, GenerationOptions(max_len=2, min_len=5))  # fresh private seed each call
    b = generate_latents(vx2_model, layout, GenerationOptions(max_len=2, min_len=5))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert a.patches.shape == b.patches.shape == (2, vx2_model.patch_size, vx2_model.feat_dim)
    assert not torch.equal(a.patches, b.patches)
