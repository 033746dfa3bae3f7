"""Parity of the CosyVoice 2 flow (tokens -> mel) with the reference fixtures ``flow_cases.npz`` (docs/design.md, "CosyVoice 2 flow")."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cadenza.errors import InputError
from cadenza.layers.masks import chunk_mask
from cadenza.layers.relpos_attention import RelPositionMultiHeadedAttention, rel_shift
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from helpers import assert_close

TOL_FEATURES = 1e-4  # encoder / mu / speaker projection / one estimator call
TOL_MEL = 1e-3  # 10 Euler steps amplify round-off


@pytest.fixture(scope="module")
def cfg(cv2_dir):
    return CosyVoice2Config.from_files(cv2_dir / "config.yaml", cv2_dir / "CosyVoice-BlankEN" / "config.json")


@pytest.fixture(scope="module")
def flow(cfg, cv2_dir):
    model = TokenToMelFlow(cfg.flow).eval()
    sd = torch.load(cv2_dir / "flow.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(sd, strict=True)
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


def test_state_dict_is_parameters_only(flow, cv2_dir):
    sd = torch.load(cv2_dir / "flow.pt", map_location="cpu", weights_only=True)
    assert list(flow.state_dict().keys()) == list(sd.keys())
    assert len(list(flow.buffers())) == 0


def test_cfm_noise_equals_fixture(flow, cv2_dir, cv2_npz):
    noise = np.load(cv2_dir / "cfm_rand_noise.npy")
    assert np.array_equal(flow.decoder.rand_noise.numpy(), noise)
    first = cv2_npz("flow_cases")["cfm_rand_noise_first240"]
    assert np.array_equal(flow.decoder.initial_noise(first.shape[2], torch.device("cpu"), torch.float32), first)


def test_building_the_flow_leaves_global_rng_alone(cfg):
    # The reference reseeds every global RNG while building the flow (for its fixed noise); we must not. On the
    # meta device parameter initialisation draws nothing, so the CPU generator must be untouched.
    state = torch.get_rng_state()
    with torch.device("meta"):
        TokenToMelFlow(cfg.flow)
    assert torch.equal(torch.get_rng_state(), state)


def test_encoder_mu_and_speaker(flow, case):
    z = case["z"]
    with torch.inference_mode():
        x = flow.input_embedding(torch.cat([case["prompt_token"], case["token"]], dim=1))
        h, mask = flow.encoder(x, streaming=False)
        assert_close(h, z["encoder_out_nonstream"], TOL_FEATURES, "encoder_out_nonstream")
        assert bool(mask.all()) and mask.shape == (1, 1, h.size(1))
        mu = flow.encoder_proj(h).transpose(1, 2)
        assert_close(mu, z["mu_nonstream"], TOL_FEATURES, "mu_nonstream")
        assert_close(flow.speaker_projection(case["embedding"]), z["spk_proj"], TOL_FEATURES, "spk_proj")


@pytest.mark.parametrize("streaming", [False, True])
def test_estimator_single_call(flow, case, cv2_manifest, streaming):
    z = case["z"]
    t_value = float(cv2_manifest["info"]["seeds"]["est_t"])
    assert np.allclose(z["est_t"], t_value)
    x = torch.from_numpy(z["est_x"])
    t = torch.full((x.size(0),), t_value, dtype=torch.float32)
    mask = torch.ones(x.size(0), 1, x.size(2))
    with torch.inference_mode():
        out = flow.decoder.estimator(
            x, mask, torch.from_numpy(z["est_mu"]), t, torch.from_numpy(z["est_spks"]),
            torch.from_numpy(z["est_cond"]), streaming=streaming,
        )
    name = "est_out_streaming" if streaming else "est_out_nonstream"
    assert_close(out, z[name], TOL_FEATURES, name)


@pytest.mark.parametrize("streaming,name", [(False, "mel_nonstream"), (True, "mel_streaming_true_finalize_true")])
def test_full_utterance_mel(flow, case, streaming, name):
    mel = flow.inference(
        case["token"], case["prompt_token"], case["prompt_feat"], case["embedding"], streaming=streaming, finalize=True
    )
    assert_close(mel, case["z"][name], TOL_MEL, name)


def test_streaming_plan(flow, case, cfg, cv2_manifest):
    z = case["z"]
    ratio = cfg.flow.token_mel_ratio
    new_parts = []
    for call in cv2_manifest["info"]["flow_stream_plan"]:
        mel = flow.inference(
            case["token"][:, : call["tokens_in"]], case["prompt_token"], case["prompt_feat"], case["embedding"],
            streaming=call["streaming"], finalize=call["finalize"],
        )
        name = f"stream_call{call['call']}_full"
        assert_close(mel, z[name], TOL_MEL, name)
        new_parts.append(mel[:, :, ratio * call["token_offset"] :])
    assert_close(torch.cat(new_parts, dim=2), z["mel_stream_concat"], TOL_MEL, "mel_stream_concat")


def test_meta_build_then_assign_load(cfg, cv2_dir, case):
    """A flow built on the meta device and loaded with ``assign=True`` needs nothing else materialised."""
    with torch.device("meta"):
        model = TokenToMelFlow(cfg.flow)
    sd = torch.load(cv2_dir / "flow.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(sd, strict=True, assign=True)
    model.eval()
    mel = model.inference(
        case["token"], case["prompt_token"], case["prompt_feat"], case["embedding"], streaming=False, finalize=True
    )
    assert_close(mel, case["z"]["mel_nonstream"], TOL_MEL, "mel_nonstream (meta build)")


def test_input_errors(flow, case):
    with pytest.raises(InputError):
        flow.inference(case["token"][:, :2], case["prompt_token"][:, :0], case["prompt_feat"][:, :0],
                       case["embedding"], finalize=False)
    with pytest.raises(InputError):
        flow.decoder.initial_noise(flow.decoder.rand_noise.size(2) + 1, torch.device("cpu"), torch.float32)


def test_cfm_training_loss_is_reproducible(flow, case):
    z = case["z"]
    mu = torch.from_numpy(z["mu_nonstream"])
    x1 = torch.randn(mu.shape, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(1, 1, mu.size(2))
    spks = torch.from_numpy(z["spk_proj"])
    cond = torch.zeros_like(mu)
    losses = [
        flow.decoder.compute_loss(x1, mask, mu, spks, cond, generator=torch.Generator().manual_seed(3))[0]
        for _ in range(2)
    ]
    assert torch.isfinite(losses[0]) and float(losses[0].detach()) > 0
    assert torch.equal(losses[0], losses[1])


def test_chunk_mask_and_rel_shift():
    m = chunk_mask(7, 3)
    i, j = torch.meshgrid(torch.arange(7), torch.arange(7), indexing="ij")
    assert torch.equal(m, j < (i // 3 + 1) * 3)
    limited = chunk_mask(7, 3, num_left_chunks=1)
    assert torch.equal(limited, m & (j >= ((i // 3 - 1).clamp(min=0) * 3)))
    t = 5
    x = torch.randn(1, 2, t, 2 * t - 1)
    shifted = rel_shift(x)
    for a in range(t):
        for b in range(t):
            assert torch.equal(shifted[0, :, a, b], x[0, :, a, t - 1 - a + b])


def test_full_size_layout_on_meta():
    with torch.device("meta"):
        model = TokenToMelFlow(CosyVoice2Config.official().flow)
    sd = model.state_dict()
    assert len(sd) == 1121
    assert sum(v.numel() for v in sd.values()) == 112_549_360
    expected = {
        "input_embedding.weight": (6561, 512),
        "spk_embed_affine_layer.weight": (80, 192),
        "encoder.embed.out.0.weight": (512, 512),
        "encoder.embed.out.1.weight": (512,),
        "encoder.pre_lookahead_layer.conv1.weight": (512, 512, 4),
        "encoder.pre_lookahead_layer.conv2.weight": (512, 512, 3),
        "encoder.encoders.5.self_attn.pos_bias_u": (8, 64),
        "encoder.encoders.0.self_attn.linear_pos.weight": (512, 512),
        "encoder.encoders.0.feed_forward.w_1.weight": (2048, 512),
        "encoder.up_layer.conv.weight": (512, 512, 5),
        "encoder.up_encoders.3.norm_mha.bias": (512,),
        "encoder.after_norm.weight": (512,),
        "encoder_proj.weight": (80, 512),
        "decoder.estimator.time_mlp.linear_1.weight": (1024, 320),
        "decoder.estimator.time_mlp.linear_2.weight": (1024, 1024),
        "decoder.estimator.down_blocks.0.0.mlp.1.weight": (256, 1024),
        "decoder.estimator.down_blocks.0.0.block1.block.0.weight": (256, 320, 3),
        "decoder.estimator.down_blocks.0.0.block1.block.2.weight": (256,),
        "decoder.estimator.down_blocks.0.0.res_conv.weight": (256, 320, 1),
        "decoder.estimator.down_blocks.0.1.3.attn1.to_q.weight": (512, 256),
        "decoder.estimator.down_blocks.0.1.0.attn1.to_out.0.weight": (256, 512),
        "decoder.estimator.down_blocks.0.1.0.ff.net.0.proj.weight": (1024, 256),
        "decoder.estimator.down_blocks.0.2.weight": (256, 256, 3),
        "decoder.estimator.mid_blocks.11.0.res_conv.weight": (256, 256, 1),
        "decoder.estimator.mid_blocks.11.1.3.ff.net.2.weight": (256, 1024),
        "decoder.estimator.up_blocks.0.0.block1.block.0.weight": (256, 512, 3),
        "decoder.estimator.up_blocks.0.0.res_conv.weight": (256, 512, 1),
        "decoder.estimator.up_blocks.0.2.weight": (256, 256, 3),
        "decoder.estimator.final_block.block.0.weight": (256, 256, 3),
        "decoder.estimator.final_proj.weight": (80, 256, 1),
        "decoder.estimator.final_proj.bias": (80,),
    }
    for key, shape in expected.items():
        assert tuple(sd[key].shape) == shape, key
    assert not any(k.startswith("decoder.estimator.down_blocks.0.1.0.attn1.to_q.bias") for k in sd)


def _relpos_formula(attn, q, k, v, p, mask):
    """The reference's rel_selfattn, written out: scores of both terms, -inf where masked, softmax, zeros after."""
    qt = q.transpose(1, 2)
    ac = (qt + attn.pos_bias_u).transpose(1, 2) @ k.transpose(-2, -1)
    bd = rel_shift((qt + attn.pos_bias_v).transpose(1, 2) @ p.transpose(-2, -1))
    blocked = mask.unsqueeze(1).eq(0)
    scores = ((ac + bd) / math.sqrt(attn.d_k)).masked_fill(blocked, -float("inf"))
    out = torch.softmax(scores, dim=-1).masked_fill(blocked, 0.0) @ v
    return attn.linear_out(out.transpose(1, 2).reshape(q.size(0), -1, attn.h * attn.d_k))


def test_fused_relpos_attention_equals_the_formula():
    """SDPA with the position term as bias == the two-matrix formula, with padding (a query row with no key at all
    gives zeros, not NaN), for values and for gradients."""
    torch.manual_seed(0)
    attn = RelPositionMultiHeadedAttention(4, 32)
    t = 9
    q, k, v = (torch.randn(2, 4, t, 8, requires_grad=True) for _ in range(3))
    pos = torch.randn(1, 2 * t - 1, 32)
    mask = chunk_mask(t, 3).unsqueeze(0).repeat(2, 1, 1)
    mask[1, :, 6:] = False  # the second row is padded after 6 keys ...
    mask[1, 4] = False  # ... and one of its queries sees nothing
    out = attn.attend(q, k, v, pos, mask)
    p = attn._heads(attn.linear_pos(pos))
    expected = _relpos_formula(attn, q, k, v, p, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, attn.pos_bias_v))
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v, attn.pos_bias_v))
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
