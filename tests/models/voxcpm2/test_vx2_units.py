"""VoxCPM 2 components against ``unit.safetensors`` of the reduced parity fixture (README §3).

Tolerances (fixture README): 1e-5 for single blocks, 1e-4 for transformer stacks. Sizes, lengths and constants are
read from the fixture files and the manifest, never from this file.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from cadenza.models.voxcpm2.cfm import time_grid, zero_init_steps
from cadenza.models.voxcpm2.config import VoxCPM2Config
from cadenza.models.voxcpm2.minicpm4 import MiniCPMModel
from helpers import assert_close

BLOCK_TOL = 1e-5
STACK_TOL = 1e-4


@pytest.fixture(scope="module")
def unit(vx2_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(vx2_dir / "unit.safetensors"))


@pytest.fixture(scope="module")
def config(vx2_dir: Path) -> VoxCPM2Config:
    return VoxCPM2Config.from_json(vx2_dir / "tiny_model" / "config.json")


def test_parameter_counts(vx2_model, vx2_manifest):
    counts = vx2_manifest["tiny_param_counts"]
    for name in ("base_lm", "residual_lm", "feat_encoder", "feat_decoder"):
        assert sum(p.numel() for p in getattr(vx2_model, name).parameters()) == counts[name], name


def test_rope_tables(vx2_model, unit):
    n = unit["rope_base_cos"].shape[0]
    cos, sin = vx2_model.base_lm.rope(torch.arange(n))
    assert_close(cos, unit["rope_base_cos"], BLOCK_TOL, "rope_base_cos")
    assert_close(sin, unit["rope_base_sin"], BLOCK_TOL, "rope_base_sin")
    n = unit["rope_locenc_cos"].shape[0]
    cos, sin = vx2_model.feat_encoder.encoder.rope(torch.arange(n))
    assert_close(cos, unit["rope_locenc_cos"], BLOCK_TOL, "rope_locenc_cos")
    assert_close(sin, unit["rope_locenc_sin"], BLOCK_TOL, "rope_locenc_sin")
    assert vx2_model.residual_lm.rope is None  # residual_lm_no_rope


def test_rope_long_factors(config, unit, vx2_manifest):
    # The fixture's "long" table uses max_position_embeddings = orig^(s^2) (s = the recorded scaling factor),
    # i.e. the length whose LongRoPE scale is s; above the original length the long factors apply.
    lm = config.lm_config
    orig = lm.rope_scaling.original_max_position_embeddings
    s = vx2_manifest["rope_long_scaling_factor"]
    max_pos = round(orig ** (s * s))
    assert max_pos > orig
    stack = MiniCPMModel(lm.replace(max_position_embeddings=max_pos))
    assert math.isclose(stack.rope.scaling_factor, s, rel_tol=1e-12)
    assert stack.rope.factors == lm.rope_scaling.long_factor
    cos, sin = stack.rope(torch.arange(unit["rope_long_cos"].shape[0]))
    assert_close(cos, unit["rope_long_cos"], BLOCK_TOL, "rope_long_cos")
    assert_close(sin, unit["rope_long_sin"], BLOCK_TOL, "rope_long_sin")


@pytest.mark.parametrize("stack", ["base_lm", "residual_lm"])
def test_lm_prefill_and_steps(vx2_model, unit, stack):
    lm = getattr(vx2_model, stack)
    x = unit["base_lm_in"]
    n_prefill, n_steps = unit[f"{stack}_prefill_out"].shape[1], unit[f"{stack}_step_out"].shape[1]
    cache = lm.new_cache()
    with torch.no_grad():
        out = lm(x[:, :n_prefill], causal=True, cache=cache)
        assert_close(out, unit[f"{stack}_prefill_out"], STACK_TOL, f"{stack} prefill")
        steps = [lm(x[:, n_prefill + j : n_prefill + j + 1], causal=True, cache=cache) for j in range(n_steps)]
    assert_close(torch.cat(steps, dim=1), unit[f"{stack}_step_out"], STACK_TOL, f"{stack} steps")
    assert cache.length == n_prefill + n_steps
    if stack == "base_lm":  # layer-0 K (after RoPE) and V as cached by the prefill
        assert_close(cache.keys(0)[:, :, :n_prefill], unit["base_lm_prefill_k_layer0"], BLOCK_TOL, "k layer 0")
        assert_close(cache.values(0)[:, :, :n_prefill], unit["base_lm_prefill_v_layer0"], BLOCK_TOL, "v layer 0")
        with torch.no_grad():
            assert_close(lm(x, causal=True), unit["base_lm_full_out"], STACK_TOL, "base_lm full")


def test_mup_variant(vx2_model, config, unit):
    mup = MiniCPMModel(config.lm_config.replace(use_mup=True))
    mup.load_state_dict(vx2_model.base_lm.state_dict())
    n = unit["base_lm_mup_prefill_out"].shape[1]
    with torch.no_grad():
        out = mup(unit["base_lm_in"][:, :n], causal=True)
    assert_close(out, unit["base_lm_mup_prefill_out"], STACK_TOL, "mup prefill")


def test_local_encoder(vx2_model, unit):
    with torch.no_grad():
        enc = vx2_model.feat_encoder(unit["locenc_in"])
        assert_close(enc, unit["locenc_out"], STACK_TOL, "locenc")
        assert_close(vx2_model.enc_to_lm_proj(enc), unit["enc_to_lm_proj_out"], STACK_TOL, "enc_to_lm_proj")


def test_fsq(vx2_model, unit):
    with torch.no_grad():
        codes = vx2_model.fsq_layer.codes(unit["fsq_in"])
        assert torch.equal(codes, unit["fsq_codes"])
        assert codes.abs().max() <= vx2_model.config.scalar_quantization_scale
        assert_close(vx2_model.fsq_layer(unit["fsq_in"]), unit["fsq_out"], BLOCK_TOL, "fsq_out")


def test_fsq_straight_through_gradient(vx2_model, unit):
    fsq = vx2_model.fsq_layer.train()
    try:
        x = unit["fsq_in"].clone().requires_grad_(True)
        out = fsq(x)
        with torch.no_grad():
            fsq.eval()
            assert_close(out.detach(), fsq(x), 0.0, "train == eval forward")
        out.sum().backward()
        assert x.grad is not None and x.grad.abs().sum() > 0  # rounding does not block the gradient
    finally:
        fsq.eval()


def test_stop_head(vx2_model, unit):
    with torch.no_grad():
        assert_close(vx2_model.stop_logits(unit["stop_in"]), unit["stop_logits"], BLOCK_TOL, "stop logits")


def test_time_embedding(vx2_model, unit):
    emb = vx2_model.feat_decoder.estimator.time_embeddings(unit["time_emb_t"])
    assert_close(emb, unit["time_emb_sinusoid"], BLOCK_TOL, "time embedding")


def test_time_grids(unit, vx2_manifest):
    keys = [k for k in unit if re.fullmatch(r"t_span_n\d+", k)]
    assert keys
    for key in keys:
        n = int(key.removeprefix("t_span_n"))
        assert_close(time_grid(n), unit[key], 1e-6, key)
        assert zero_init_steps(n) == vx2_manifest[f"zero_init_steps_n{n}"], key


@pytest.mark.parametrize("dt_key,out_key", [("dit_dt", "dit_out"), ("dit_dt_nonzero", "dit_out_dt_nonzero")])
def test_dit_estimator(vx2_model, unit, dt_key, out_key):
    with torch.no_grad():
        out = vx2_model.feat_decoder.estimator(unit["dit_x"], unit["dit_mu"], unit["dit_t"], unit["dit_cond"], unit[dt_key])
    assert_close(out, unit[out_key], STACK_TOL, out_key)


def test_flow_sampler(vx2_model, unit):
    cases = [m for m in (re.fullmatch(r"cfm_out_n(\d+)_cfg([\d.]+)(_nozerostar)?", k) for k in unit) if m]
    assert len(cases) >= 2
    for m in cases:
        n, w, zero_star = int(m.group(1)), float(m.group(2)), m.group(3) is None
        with torch.no_grad():
            out = vx2_model.feat_decoder(
                unit["cfm_mu"], unit["cfm_cond"], unit["cfm_noise"], n_timesteps=n, cfg_value=w,
                use_cfg_zero_star=zero_star,
            )
        assert_close(out, unit[m.group(0)], STACK_TOL, m.group(0))


def test_cfg_value_one_without_zero_star_is_plain_euler(vx2_model, unit):
    # w = 1 and s* = 1: v = v_u + (v_c - v_u) = v_c, i.e. Euler on the conditional velocity alone, for any batch
    # (t and dt are per row) and with the real dt fed in mean mode. Equal up to the rounding of that subtraction.
    sampler, n = vx2_model.feat_decoder, 10
    est, grid = sampler.estimator, time_grid(n)
    mu, cond, noise = unit["cfm_mu"], unit["cfm_cond"], unit["cfm_noise"]
    b = noise.shape[0]
    x, t = noise.clone(), grid[0]
    with torch.no_grad():
        for k in range(n):
            dt = t - grid[k + 1]
            dt_in = dt.expand(b) if sampler.mean_mode else torch.zeros(b)
            x = x - dt * est(x, mu, t.expand(b), cond, dt_in)
            t = t - dt
        out = sampler(mu, cond, noise, n, 1.0, use_cfg_zero_star=False)
    assert_close(out, x, STACK_TOL * max(1.0, float(x.abs().max())), "cfg 1 == conditional Euler")
