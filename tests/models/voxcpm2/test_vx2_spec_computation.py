"""VoxCPM 2 on configurations other than the parity fixture's (issue #19), against small computations written from
the spec (docs/voxcpm2.md), not against our modules: the AudioVAE's encoder and decoder, the transformer stacks and
the flow sampler, over the configurations the reference accepts (tests/vx2_small_checkpoints.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.audio_vae_loader import load_audio_vae
from cadenza.models.voxcpm2.audio_vae_streaming import StreamingAudioVAEDecoder
from cadenza.models.voxcpm2.cfm import time_grid, zero_init_steps
from cadenza.models.voxcpm2.config import VoxCPM2Config
from cadenza.models.voxcpm2.model import VoxCPM2Model
from helpers import assert_close
from vx2_small_checkpoints import ACCEPTED, accepted_model, one_thread, randomize, variant, write_checkpoint  # noqa: F401 (one_thread: autouse)

# --- AudioVAE against a decoder/encoder written from the spec -----------------------------------------------------

def _wn(sd: dict, prefix: str) -> torch.Tensor:
    g, v = sd[prefix + ".weight_g"], sd[prefix + ".weight_v"]
    return g * v / v.reshape(v.shape[0], -1).norm(dim=1).reshape(-1, *[1] * (v.dim() - 1))


def _snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


def _conv(sd: dict, prefix: str, x: torch.Tensor, left: int, stride: int = 1, dilation: int = 1,
          groups: int = 1) -> torch.Tensor:
    return F.conv1d(F.pad(x, (left, 0)), _wn(sd, prefix), sd[prefix + ".bias"], stride, 0, dilation, groups)


def _residual(sd: dict, p: str, x: torch.Tensor, d: int, depthwise: bool) -> torch.Tensor:
    y = _snake(x, sd[f"{p}.block.0.alpha"])
    y = _conv(sd, f"{p}.block.1", y, 6 * d, dilation=d, groups=x.shape[1] if depthwise else 1)
    return x + _conv(sd, f"{p}.block.3", _snake(y, sd[f"{p}.block.2.alpha"]), 0)


def spec_decode(sd: dict, cfg: AudioVAEConfig, z: torch.Tensor, sample_rate: int) -> torch.Tensor:
    """The AudioVAE decoder (docs/design.md) from the release-format state dict (``z [B, D, T]`` -> ``[B, 1, hop·T]``)."""
    n_in = 2 if cfg.depthwise else 1
    x = _conv(sd, "decoder.model.0", z, 6, groups=z.shape[1]) if cfg.depthwise else _conv(sd, "decoder.model.0", z, 6)
    if cfg.depthwise:
        x = _conv(sd, "decoder.model.1", x, 0)
    bucket = None
    if cfg.sr_bin_boundaries is not None:  # torch.bucketize, as the reference (also for unsorted boundaries)
        bucket = int(torch.bucketize(torch.tensor([sample_rate], dtype=torch.int32), sd["decoder.sr_bin_boundaries"]))
    for i, stride in enumerate(cfg.decoder_rates):
        m, f = n_in + i, f"decoder.sr_cond_model.{n_in + i}"
        if bucket is not None:
            if cfg.cond_type == "add":
                x = x + sd[f"{f}.cond_embed.weight"][bucket][None, :, None]
            elif cfg.cond_type == "concat":
                cond = sd[f"{f}.cond_embed.weight"][bucket][None, :, None].expand(x.shape[0], -1, x.shape[2])
                x = torch.cat([x, cond], 1)
            else:
                x = x * sd[f"{f}.scale_embed.weight"][bucket][None, :, None] + sd[f"{f}.bias_embed.weight"][bucket][None, :, None]
            if cfg.cond_out_layer:
                x = _conv(sd, f"{f}.out_layer.1", _snake(x, sd[f"{f}.out_layer.0.alpha"]), 0)
        x = _snake(x, sd[f"decoder.model.{m}.block.0.alpha"])
        p = f"decoder.model.{m}.block.1"
        x = F.conv_transpose1d(x, _wn(sd, p), sd[p + ".bias"], stride)[..., :-stride]
        for r, d in enumerate((1, 3, 9)):
            x = _residual(sd, f"decoder.model.{m}.block.{2 + r}", x, d, cfg.depthwise)
    last = n_in + len(cfg.decoder_rates)
    x = _snake(x, sd[f"decoder.model.{last}.alpha"])
    return torch.tanh(_conv(sd, f"decoder.model.{last + 1}", x, 6))


def spec_encode(sd: dict, cfg: AudioVAEConfig, wav: torch.Tensor) -> torch.Tensor:
    """The AudioVAE encoder (docs/design.md) mean (``wav [B, 1, N]``, N a multiple of the hop) -> ``[B, D, N / hop]``."""
    x = _conv(sd, "encoder.block.0", wav, 6)
    for b, stride in enumerate(cfg.encoder_rates, start=1):
        for r, d in enumerate((1, 3, 9)):
            x = _residual(sd, f"encoder.block.{b}.block.{r}", x, d, cfg.depthwise)
        x = _conv(sd, f"encoder.block.{b}.block.4", _snake(x, sd[f"encoder.block.{b}.block.3.alpha"]), stride,
                  stride=stride)
    return _conv(sd, "encoder.fc_mu", x, 2)


VAE_CASES = ["decoder_dim_160", "dense_vae_without_film", "film_add", "film_concat_out_layer",
             "hops_disagree_with_rates", "film_unsorted_boundaries"]


@pytest.mark.parametrize("name", VAE_CASES)
@torch.inference_mode()
def test_audio_vae_matches_spec_computation(name, tmp_path):
    config = variant(**ACCEPTED[name][0])
    _, written = write_checkpoint(tmp_path, config, seed=3)
    vae = load_audio_vae(tmp_path)
    sd = torch.load(tmp_path / "audiovae.pth", weights_only=True)["state_dict"]
    cfg = vae.cfg
    gen = torch.Generator().manual_seed(len(name))
    z = torch.randn(2, cfg.latent_dim, 7, generator=gen)  # 7 frames: not a multiple of the patch
    for rate in (16000, 24000, 48000):
        want = spec_decode(sd, cfg, z, rate)
        assert_close(vae.decode(z, sr_cond=rate), want, 2e-5, f"{name} decode @{rate}")
    # streaming in odd chunks equals one-shot
    with StreamingAudioVAEDecoder(vae) as dec:
        chunks = torch.cat([dec.decode_chunk(z[..., a:b]) for a, b in ((0, 1), (1, 4), (4, 7))], -1)
    assert_close(chunks, vae.decode(z), 1e-5, f"{name} streaming")
    n = 3 * cfg.hop_length - 5  # not a multiple of the hop: the encoder right-pads with zeros
    wav = torch.randn(2, n, generator=gen) * 0.3
    padded = F.pad(wav, (0, -n % cfg.hop_length))[:, None]
    assert_close(vae.encode(wav), spec_encode(sd, cfg, padded), 2e-5, f"{name} encode")


# --- transformer stack against a computation written from the spec -------------------------------------------------

def spec_minicpm(stack, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """The MiniCPM-4 block (docs/design.md) step by step: RMSNorm, GQA attention with LongRoPE (factor list broadcast), SwiGLU, final norm."""
    cfg = stack.cfg

    def rms(h, w):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w

    n, hd = x.shape[1], cfg.head_dim
    if not cfg.no_rope:
        rs = cfg.rope_scaling
        long = cfg.max_position_embeddings > rs.original_max_position_embeddings
        factors = torch.tensor(rs.long_factor if long else rs.short_factor, dtype=torch.float32)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(n).float(), 1.0 / factors) * inv
        scale = math.sqrt(1 + math.log(cfg.max_position_embeddings / rs.original_max_position_embeddings)
                          / math.log(rs.original_max_position_embeddings))
        cos, sin = torch.cat([freqs, freqs], -1).cos() * scale, torch.cat([freqs, freqs], -1).sin() * scale

    def rope(t):
        if cfg.no_rope:
            return t
        t1, t2 = t.chunk(2, -1)
        return t * cos + torch.cat([-t2, t1], -1) * sin

    a = cfg.scale_depth / math.sqrt(cfg.num_hidden_layers) if cfg.use_mup else 1.0
    for layer in stack.layers:
        at, mlp = layer.self_attn, layer.mlp
        h = rms(x, layer.input_layernorm.weight)
        q = rope((h @ at.q_proj.weight.T).view(1, n, -1, hd).transpose(1, 2))
        k = rope((h @ at.k_proj.weight.T).view(1, n, -1, hd).transpose(1, 2))
        v = (h @ at.v_proj.weight.T).view(1, n, -1, hd).transpose(1, 2)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        if causal:
            scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, n, -1) @ at.o_proj.weight.T
        x = x + a * o
        h = rms(x, layer.post_attention_layernorm.weight)
        x = x + a * (F.silu(h @ mlp.gate_proj.weight.T) * (h @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    return rms(x, stack.norm.weight)


@pytest.mark.parametrize("name", ["hidden_not_divisible_by_heads", "one_rope_factor", "long_factors_in_use",
                                  "ralm_with_rope_mup", "negative_rope_factor"])
@torch.inference_mode()
def test_stacks_match_spec_computation(name):
    config, model = accepted_model(name, 5)
    gen = torch.Generator().manual_seed(7)
    for stack, causal in ((model.base_lm, True), (model.residual_lm, True), (model.feat_encoder.encoder, False),
                          (model.feat_decoder.estimator.decoder, False)):
        x = torch.randn(1, 9, stack.cfg.hidden_size, generator=gen)  # 9: odd length
        assert_close(stack(x, causal=causal), spec_minicpm(stack, x, causal), 1e-5, f"{name} {stack.cfg.stack}")


# --- the flow sampler --------------------------------------------------------------------------------------------

def spec_sampler(est, mu, cond, noise, n, cfg_value, zero_star, mean_mode):
    """The patch sampler (docs/design.md: Euler on the sway grid, CFG on a [cond; uncond] batch, optional CFG-Zero*), one row at a time."""
    grid = time_grid(n)
    outs = []
    for i in range(noise.shape[0]):
        x, t, dt = noise[i:i + 1], grid[0], grid[0] - grid[1]
        for step in range(1, n + 1):
            if zero_star and step <= zero_init_steps(n):
                v = torch.zeros_like(x)
            else:
                d = (dt if mean_mode else torch.zeros(())).reshape(1)
                v_c = est(x, mu[i:i + 1], t.reshape(1), cond[i:i + 1], d)
                v_u = est(x, torch.zeros_like(mu[i:i + 1]), t.reshape(1), cond[i:i + 1], d)
                s = (v_c * v_u).sum() / (v_u.pow(2).sum() + 1e-8) if zero_star else 1.0
                v = s * v_u + cfg_value * (v_c - s * v_u)
            x, t = x - dt * v, t - dt
            if step < n:
                dt = t - grid[step + 1]
        outs.append(x)
    return torch.cat(outs)


def plain_euler(est, mu, cond, noise, n, mean_mode):
    """Euler on the conditional velocity alone: what cfg 1 without CFG-Zero* must reduce to."""
    grid = time_grid(n)
    x = noise
    for k in range(n):
        dt = grid[k] - grid[k + 1]
        t = grid[k].expand(x.shape[0])
        x = x - dt * est(x, mu, t, cond, dt.expand(x.shape[0]) if mean_mode else torch.zeros_like(t))
    return x


@pytest.mark.parametrize("name,mean_mode", [("patch_3_mean_mode", True), ("patch_3_mean_mode", False),
                                            ("hidden_not_divisible_by_heads", False), ("patch_1", False)])
@pytest.mark.parametrize("seed", [0, 1])
@torch.inference_mode()
def test_sampler_matches_spec_and_cfg_one_is_plain_euler(name, mean_mode, seed):
    changes = dict(ACCEPTED[name][0], dit_config__dit_mean_mode=mean_mode)
    config = VoxCPM2Config.from_dict(variant(**changes))
    torch.manual_seed(seed)
    model = VoxCPM2Model(config).eval()
    randomize(model, seed + 10)
    sampler, est = model.feat_decoder, model.feat_decoder.estimator
    gen = torch.Generator().manual_seed(seed)
    b, d, p = 3, config.feat_dim, config.patch_size  # a batch of 3 different rows
    mu = torch.randn(b, 2 * config.dit_config.hidden_dim, generator=gen) * 2
    cond, noise = torch.randn(b, d, p, generator=gen), torch.randn(b, d, p, generator=gen)
    for n in (1, 5):  # 1: the one step is the zero-velocity one under CFG-Zero*; 5: then 4 guided steps
        for w, zs in ((2.0, True), (3.5, False), (1.0, False)):
            got = sampler(mu, cond, noise, n, w, use_cfg_zero_star=zs)
            assert_close(got, spec_sampler(est, mu, cond, noise, n, w, zs, mean_mode), 1e-5, f"n={n} w={w} zs={zs}")
            # batch == single rows
            single = torch.cat([sampler(mu[i:i + 1], cond[i:i + 1], noise[i:i + 1], n, w, use_cfg_zero_star=zs)
                                for i in range(b)])
            assert_close(got, single, 1e-5, f"batch vs single n={n}")
        # cfg 1 without CFG-Zero*: v_u + 1·(v_c - v_u) = v_c up to rounding of the subtraction
        euler = plain_euler(est, mu, cond, noise, n, mean_mode)
        scale = max(1.0, float(euler.abs().max()))
        assert_close(sampler(mu, cond, noise, n, 1.0, use_cfg_zero_star=False), euler, 1e-5 * scale, f"euler n={n}")

