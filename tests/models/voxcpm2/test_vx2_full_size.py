"""The released VoxCPM 2 architecture built on the ``meta`` device from ``VoxCPM2Config.official()`` (no weights):
577 tensors named and shaped as ``model.safetensors`` (docs/design.md, "VoxCPM 2 release files and configuration"), with the parameter counts given there."""

from __future__ import annotations

import re

import pytest
import torch

from cadenza.models.voxcpm2.config import VoxCPM2Config
from cadenza.models.voxcpm2.model import VoxCPM2Model

# the released checkpoint (docs/design.md, "VoxCPM 2 release files and configuration")
PARAMS = {
    "base_lm": 1_471_744_000,
    "residual_lm": 377_522_176,
    "feat_encoder": 207_711_232,
    "feat_decoder": 212_040_768,
}
PROJECTIONS = {
    "fsq_layer": 2_099_712, "enc_to_lm_proj": 2_099_200, "lm_to_dit_proj": 2_098_176, "res_to_dit_proj": 2_098_176,
    "fusion_concat_proj": 8_390_656, "stop_proj": 4_196_352, "stop_head": 4_096,
}
TOTAL = 2_290_004_544
KEYS_PER_STACK = {"base_lm.": 254, "residual_lm.": 73, "feat_encoder.": 112, "feat_decoder.": 123}
N_KEYS = 577


@pytest.fixture(scope="module")
def config() -> VoxCPM2Config:
    return VoxCPM2Config.official()


@pytest.fixture(scope="module")
def shapes(config) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = VoxCPM2Model(config)
    assert all(p.is_meta for p in model.parameters())
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_key_count(shapes):
    assert len(shapes) == N_KEYS
    for prefix, n in KEYS_PER_STACK.items():
        assert sum(k.startswith(prefix) for k in shapes) == n, prefix
    assert sum(not any(k.startswith(p) for p in KEYS_PER_STACK) for k in shapes) == N_KEYS - sum(KEYS_PER_STACK.values())


def test_parameter_counts(config):
    with torch.device("meta"):
        model = VoxCPM2Model(config)
    for name, n in {**PARAMS, **PROJECTIONS}.items():
        assert sum(p.numel() for p in getattr(model, name).parameters()) == n, name
    assert sum(p.numel() for p in model.parameters()) == TOTAL
    assert model.base_lm.embed_tokens.weight.numel() == 150_421_504


def test_non_layer_shapes(shapes):
    expected = {
        "base_lm.embed_tokens.weight": (73448, 2048), "base_lm.norm.weight": (2048,),
        "residual_lm.norm.weight": (2048,), "feat_encoder.special_token": (1, 1, 1, 1024),
        "feat_encoder.in_proj.weight": (1024, 64), "feat_encoder.in_proj.bias": (1024,),
        "feat_encoder.encoder.norm.weight": (1024,),
        "feat_decoder.estimator.in_proj.weight": (1024, 64), "feat_decoder.estimator.cond_proj.weight": (1024, 64),
        "feat_decoder.estimator.out_proj.weight": (64, 1024), "feat_decoder.estimator.out_proj.bias": (64,),
        "feat_decoder.estimator.time_mlp.linear_1.weight": (1024, 1024),
        "feat_decoder.estimator.time_mlp.linear_2.bias": (1024,),
        "feat_decoder.estimator.delta_time_mlp.linear_2.weight": (1024, 1024),
        "feat_decoder.estimator.decoder.norm.weight": (1024,),
        "fsq_layer.in_proj.weight": (512, 2048), "fsq_layer.in_proj.bias": (512,),
        "fsq_layer.out_proj.weight": (2048, 512), "fsq_layer.out_proj.bias": (2048,),
        "enc_to_lm_proj.weight": (2048, 1024), "lm_to_dit_proj.weight": (1024, 2048),
        "res_to_dit_proj.weight": (1024, 2048), "fusion_concat_proj.weight": (2048, 4096),
        "stop_proj.weight": (2048, 2048), "stop_proj.bias": (2048,), "stop_head.weight": (2, 2048),
    }
    for key, shape in expected.items():
        assert shapes[key] == shape, key
    assert "stop_head.bias" not in shapes


@pytest.mark.parametrize(
    "prefix,layers,h,f,q,kv",
    [
        ("base_lm.", 28, 2048, 6144, 2048, 256),
        ("residual_lm.", 8, 2048, 6144, 2048, 256),
        ("feat_encoder.encoder.", 12, 1024, 4096, 2048, 256),  # q/o width 16 x 128 != hidden
        ("feat_decoder.estimator.decoder.", 12, 1024, 4096, 2048, 256),
    ],
)
def test_layer_shapes(shapes, prefix, layers, h, f, q, kv):
    per_layer = {
        "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q), "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h),
        "mlp.down_proj.weight": (h, f),
    }
    layer_keys = [k for k in shapes if k.startswith(prefix + "layers.")]
    assert len(layer_keys) == layers * len(per_layer)
    assert {int(re.match(rf"{re.escape(prefix)}layers\.(\d+)\.", k).group(1)) for k in layer_keys} == set(range(layers))
    for i in range(layers):
        for suffix, shape in per_layer.items():
            assert shapes[f"{prefix}layers.{i}.{suffix}"] == shape
    assert shapes[prefix + "norm.weight"] == (h,)


def test_derived_stack_configs(config):
    assert config.encoder_lm_config().num_key_value_heads == config.lm_config.num_key_value_heads == 2
    assert config.residual_lm_config().no_rope and not config.encoder_lm_config().no_rope
    assert not config.lm_config.use_mup and config.dit_config.dit_mean_mode is False
    rs = config.lm_config.rope_scaling
    assert len(rs.short_factor) == config.lm_config.head_dim // 2 == 64
    with torch.device("meta"):
        model = VoxCPM2Model(config)
    assert model.residual_lm.rope is None
    assert model.base_lm.rope.scaling_factor == 1.0  # max_position_embeddings == original
