"""VoxCPM 2 on configurations other than the parity fixture's (issue #19): the loaders' validators, parity with
independent re-computations, and batch == single, over several sizes, odd lengths and seeds.

Every checkpoint here is written by these tests in the release's folder layout (``config.json``,
``model.safetensors``, ``audiovae.pth`` with weight-norm ``g``/``v`` pairs, ``tokenizer.json``) from random weights,
so nothing depends on the shared fixtures. ``ACCEPTED`` lists configurations the reference (OpenBMB/VoxCPM
``616d3d3``) builds and runs — each one sits on the boundary of one of our checks — and every one of them must load
and synthesise here. ``REJECTED`` lists configurations the reference cannot run (it crashes while building or
running them, or every output is NaN); each must fail at load with a ``CheckpointError`` naming the config key.
The values tests compare against small computations written from the spec (docs/voxcpm2.md), not against our
modules.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.errors import CheckpointError, TextError
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.audio_vae_loader import load_audio_vae, release_state_dict
from cadenza.models.voxcpm2.audio_vae_streaming import StreamingAudioVAEDecoder
from cadenza.models.voxcpm2.cfm import time_grid, zero_init_steps
from cadenza.models.voxcpm2.config import SpecialTokens, VoxCPM2Config
from cadenza.models.voxcpm2.layouts import build_layout
from cadenza.models.voxcpm2.loader import load_voxcpm2
from cadenza.models.voxcpm2.model import VoxCPM2Model
from helpers import assert_close

SPECIAL = SpecialTokens()
PROMPT_RATE = 16000

# Small, fast, and unlike the fixture on purpose: patch 2, one layer per stack, an AudioVAE 32x narrower.
BASE: dict = {
    "architecture": "voxcpm2",
    "lm_config": {
        "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 16, "intermediate_size": 24,
        "max_position_embeddings": 256, "num_attention_heads": 4, "num_hidden_layers": 1, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 10000, "kv_channels": 4,
        "rope_scaling": {"type": "longrope", "long_factor": [1.0, 2.0], "short_factor": [1.0, 1.5],
                         "original_max_position_embeddings": 256},
        "vocab_size": 128, "use_mup": False, "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4,
    },
    "patch_size": 2, "feat_dim": 8, "scalar_quantization_latent_dim": 8, "scalar_quantization_scale": 9,
    "residual_lm_num_layers": 1, "residual_lm_no_rope": True,
    "encoder_config": {"hidden_dim": 8, "ffn_dim": 12, "num_heads": 2, "num_layers": 1, "kv_channels": 4},
    "dit_config": {"hidden_dim": 8, "ffn_dim": 12, "num_heads": 2, "num_layers": 1, "kv_channels": 4,
                   "cfm_config": {"sigma_min": 1e-6, "solver": "euler", "t_scheduler": "log-norm",
                                  "inference_cfg_rate": 2.0}},
    "audio_vae_config": {"encoder_dim": 2, "encoder_rates": [2, 5, 8, 8], "latent_dim": 8, "decoder_dim": 64,
                         "decoder_rates": [8, 6, 5, 2, 2, 2], "sr_bin_boundaries": [20000, 30000, 40000],
                         "sample_rate": 16000, "out_sample_rate": 48000},
    "max_length": 96, "device": "cpu", "dtype": "float32",
}

DROP = object()  # marks a key to remove in ``variant``
EXTRA_CHARS = "\u00e0\u00e1\u00e2\u00e3\u00e4\u00e5\u00e6\u00e7\u00e8\u00e9\u00ea\u00eb\u00ec\u00ed\u00ee"  # ids 105..


def variant(**changes) -> dict:
    """BASE with ``a__b__c=value`` changes (``DROP`` removes the key)."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        node, *path = data, *dotted.split("__")
        for key in path[:-1]:
            node = node[key]
        if value is DROP:
            node.pop(path[-1])
        else:
            node[path[-1]] = value
    return data


@pytest.fixture(autouse=True)
def _one_thread():
    """These models are tiny: extra intra-op threads only add synchronisation (9x slower on a busy 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- writing a checkpoint folder in the release's layout -----------------------------------------------------------

def _write_tokenizer(directory: Path, n_ids: int = 120) -> None:
    """A character-level Llama-style BPE (no merges, no byte fallback) with the release's special ids 101-104."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-()"
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "\u2581": 3}
    vocab.update({c: 4 + i for i, c in enumerate(chars)})
    vocab.update({f"<reserved_{i}>": i for i in range(len(vocab), SPECIAL.audio_start)})
    vocab.update({"<|audio_start|>": 101, "<|audio_end|>": 102, "<|ref_audio_start|>": 103, "<|ref_audio_end|>": 104})
    vocab.update({c: 105 + i for i, c in enumerate(EXTRA_CHARS[: n_ids - 105])})
    Tokenizer(BPE(vocab, [], unk_token="<unk>")).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"legacy": True, "unk_token": "<unk>"}))


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Give the parameters whose default init is trivial (norms, Snake, FiLM, biases) random values."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("alpha"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            elif name.endswith("norm.weight") or "layernorm" in name or "scale_embed" in name:
                p.copy_(1 + 0.2 * noise)
            elif name.endswith("bias") or "embed.weight" in name:
                p.add_(0.1 * noise)
            elif name == "stop_head.weight":
                p.copy_(0.3 * noise)


def write_checkpoint(directory: Path, config: dict, seed: int = 0, tokenizer_ids: int = 120
                     ) -> tuple[VoxCPM2Model, AudioVAE]:
    """Random weights in the release's files; returns the modules that were written."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    _write_tokenizer(directory, tokenizer_ids)
    torch.manual_seed(seed)
    model = VoxCPM2Model(VoxCPM2Config.from_dict(config)).eval()
    vae = AudioVAE(AudioVAEConfig.from_model_config(config)).eval()
    _randomize(model, seed + 1)
    _randomize(vae, seed + 2)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    torch.save({"state_dict": release_state_dict(vae)}, directory / "audiovae.pth")
    return model, vae


def prompt_audio(seconds: float = 0.6, seed: int = 0) -> tuple[np.ndarray, int]:
    t = np.arange(int(seconds * PROMPT_RATE)) / PROMPT_RATE
    rng = np.random.default_rng(seed)
    wav = 0.4 * np.sin(2 * np.pi * (150 + 200 * t) * t) + 0.02 * rng.standard_normal(t.size)
    return wav.astype(np.float32), PROMPT_RATE


# --- the validators ---------------------------------------------------------------------------------------------

# name -> (changes, the check it bounds). The reference (OpenBMB/VoxCPM 616d3d3) builds each of these and runs a
# zero-shot and a cloning generation with finite output (checked with the reference code outside this repository).
ACCEPTED: dict[str, tuple[dict, str]] = {
    "decoder_dim_160": ({"audio_vae_config__decoder_dim": 160}, "decoder_dim >= 2^n (floor halving: ... 5 -> 2)"),
    "decoder_dim_2pow_n": ({"audio_vae_config__decoder_dim": 8, "audio_vae_config__decoder_rates": [6, 5, 8]},
                           "decoder_dim >= 2^n, equality"),
    "hops_disagree_with_rates": ({"audio_vae_config__decoder_rates": [8, 6, 5, 2, 2], "audio_vae_config__decoder_dim": 32,
                                  "audio_vae_config__out_sample_rate": 44100}, "no hop/rate consistency check"),
    "no_encoder_block": ({"audio_vae_config__encoder_rates": [], "audio_vae_config__encoder_dim": 16,
                          "max_length": 4096}, "encoder_rates may be empty (hop 1)"),
    "dense_vae_without_film": ({"audio_vae_config__depthwise": False, "audio_vae_config__sr_bin_boundaries": None},
                               "sr_bin_boundaries may be null"),
    "film_one_bucket": ({"audio_vae_config__sr_bin_boundaries": []}, "sr_bin_boundaries may be empty"),
    "film_unsorted_boundaries": ({"audio_vae_config__sr_bin_boundaries": [40000, 20000, 20000]},
                                 "sr_bin_boundaries: any integers"),
    "film_add": ({"audio_vae_config__cond_type": "add"}, "cond_type add"),
    "film_concat_out_layer": ({"audio_vae_config__cond_type": "concat", "audio_vae_config__cond_out_layer": True,
                               "audio_vae_config__cond_dim": 3}, "concat needs cond_out_layer"),
    "film_out_layer_cond_dim_0": ({"audio_vae_config__cond_out_layer": True, "audio_vae_config__cond_dim": 0},
                                  "cond_dim only matters for concat"),
    "vae_latent_default_64": ({"audio_vae_config__latent_dim": DROP, "feat_dim": 64},
                              "latent_dim == feat_dim with the AudioVAE default"),
    "hidden_not_divisible_by_heads": ({"lm_config__hidden_size": 18, "lm_config__kv_channels": DROP},
                                      "head dim = hidden // heads (4)"),
    "one_rope_factor": ({"lm_config__rope_scaling__short_factor": [1.5],
                         "lm_config__rope_scaling__long_factor": [2.0, 3.0, 4.0]},
                        "factor list of length 1; the unused list is free"),
    "long_factors_in_use": ({"lm_config__max_position_embeddings": 512,
                             "lm_config__rope_scaling__short_factor": [1.0, 2.0, 3.0]},
                            "long_factor used when max_pos > original; the unused list is free"),
    "negative_rope_factor": ({"lm_config__rope_scaling__short_factor": [-1.0, 2.0]}, "factors must be non-zero"),
    "odd_head_dim_without_rope": ({"lm_config__no_rope": True, "lm_config__kv_channels": 3,
                                   "encoder_config__kv_channels": 3, "dit_config__kv_channels": 3},
                                  "even head dim only with RoPE"),
    "ralm_with_rope_mup": ({"residual_lm_no_rope": False, "lm_config__use_mup": True}, "RALM RoPE checked as a stack"),
    "layer_free_locenc_locdit_no_mlp": ({"encoder_config__num_layers": 0, "dit_config__num_layers": 0,
                                         "lm_config__intermediate_size": 0}, "layers >= 0, ffn >= 0"),
    "dit_hidden_4": ({"dit_config__hidden_dim": 4, "dit_config__kv_channels": 4}, "DiT hidden even and >= 4"),
    "unknown_solver_and_scheduler": ({"dit_config__cfm_config__solver": "heun",
                                      "dit_config__cfm_config__t_scheduler": "cosine"}, "inference ignores them"),
    "negative_fsq_scale": ({"scalar_quantization_scale": -3}, "FSQ scale must be non-zero"),
    "patch_3_mean_mode": ({"patch_size": 3, "dit_config__dit_mean_mode": True}, "odd patch size; mean mode"),
    "patch_1": ({"patch_size": 1}, "patch_size >= 1"),
    "rope_original_max_2": ({"lm_config__max_position_embeddings": 64,
                             "lm_config__rope_scaling__original_max_position_embeddings": 2},
                            "original_max_position_embeddings >= 2 (long factors, scale sqrt(6))"),
    "lax_values": ({"lm_config__hidden_size": "16", "feat_dim": 8.0, "lm_config__use_mup": "no",
                    "audio_vae_config__decoder_dim": "64"}, "pydantic lax coercion"),
    "null_latent_dim": ({"audio_vae_config__latent_dim": None, "audio_vae_config__encoder_dim": 1,
                         "audio_vae_config__encoder_rates": [2, 5, 8, 8], "feat_dim": 16},
                        "latent_dim null = encoder_dim * 2^n"),
}


PLAIN_ONLY = {"no_encoder_block"}  # hop 1: a 0.5 s prompt would take thousands of positions


def _engine_run(directory: Path, seed: int = 1, prompts: bool = True) -> dict[str, np.ndarray]:
    engine = VoxCPM2Engine.from_pretrained(directory)
    out = {}
    # plain, and combined (reference + continuation: both prompt encodings, the longest layout)
    modes = {"plain": {}, "combined": {"reference_wav": prompt_audio(seed=1), "prompt_wav": prompt_audio(0.5, 2),
                                       "prompt_text": "It is."}}
    for name, kwargs in modes.items():
        if not prompts and kwargs:
            continue
        req = engine.build("Hi there.", seed=seed, retry=False, max_len=3, min_len=0, inference_timesteps=2,
                           **kwargs)
        out[name] = engine.synthesize(req)
        n = req.outcome.result.patches.shape[0]
        assert 1 <= n <= 3
        assert out[name].shape == (n * engine.config.patch_size * engine.vae.decode_hop_length,)
    return out


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")  # ffn 0: PyTorch notes the empty weights
@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_reference_accepted_config_loads_and_runs(name, tmp_path):
    changes, _ = ACCEPTED[name]
    config = variant(**changes)
    model, vae = write_checkpoint(tmp_path, config, seed=len(name))
    loaded = load_voxcpm2(tmp_path)
    # state-dict round trip: the model exactly, the AudioVAE through the weight-norm g/v pair
    got = loaded.model.state_dict()
    assert got.keys() == model.state_dict().keys()
    assert all(torch.equal(got[k], v) for k, v in model.state_dict().items())
    other = load_audio_vae(tmp_path)
    for (k, v), (k2, v2) in zip(vae.state_dict().items(), other.state_dict().items()):
        assert k == k2 and v.shape == v2.shape, k
        assert_close(v2, v, 1e-6 * max(1.0, float(v.abs().max()) if v.numel() else 0.0), k)
    for wav in _engine_run(tmp_path, prompts=name not in PLAIN_ONLY).values():
        assert np.isfinite(wav).all()
    if name in PLAIN_ONLY:
        assert other.encode(torch.randn(1, 37)).shape == (1, other.latent_dim, 37)


REJECTED: dict[str, tuple[dict, str]] = {
    # AudioVAE: zero-channel or missing decoder blocks fail to build in the reference
    "decoder_dim_below_2pow_n": ({"audio_vae_config__decoder_dim": 63}, "decoder_dim"),
    "no_decoder_block": ({"audio_vae_config__decoder_rates": []}, "decoder_rates"),
    "zero_stride": ({"audio_vae_config__encoder_rates": [2, 0]}, "encoder_rates"),
    "zero_encoder_dim": ({"audio_vae_config__encoder_dim": 0}, "encoder_dim"),
    "zero_sample_rate": ({"audio_vae_config__out_sample_rate": 0}, "out_sample_rate"),
    "unknown_cond_type": ({"audio_vae_config__cond_type": "film"}, "cond_type"),
    "concat_without_out_layer": ({"audio_vae_config__cond_type": "concat"}, "cond_out_layer"),
    "noise_block_unsupported": ({"audio_vae_config__use_noise_block": True}, "use_noise_block"),
    "latent_dim_vs_feat_dim": ({"audio_vae_config__latent_dim": 16}, "latent_dim"),
    "vae_default_latent_vs_feat_dim": ({"audio_vae_config__latent_dim": DROP}, "latent_dim"),
    "vae_bad_type": ({"audio_vae_config__depthwise": "maybe"}, "depthwise"),
    # transformer stacks: SDPA / RoPE / RMSNorm needs
    "heads_not_multiple_of_kv": ({"lm_config__num_attention_heads": 3}, "lm_config.num_attention_heads"),
    "locenc_heads_vs_inherited_kv": ({"encoder_config__num_heads": 3}, "encoder_config.num_heads"),
    "dit_heads_vs_inherited_kv": ({"dit_config__num_heads": 1}, "dit_config.num_heads"),
    "zero_kv_heads": ({"lm_config__num_key_value_heads": 0}, "lm_config.num_key_value_heads"),
    "zero_kv_channels": ({"lm_config__kv_channels": 0}, "lm_config.kv_channels"),
    "head_dim_zero": ({"encoder_config__kv_channels": DROP, "encoder_config__hidden_dim": 1},
                      "encoder_config.hidden_dim"),
    "odd_head_dim_with_rope": ({"dit_config__kv_channels": 5}, "dit_config.kv_channels"),
    "odd_head_dim_ralm_rope": ({"residual_lm_no_rope": False, "lm_config__no_rope": True, "lm_config__kv_channels": 5,
                                "encoder_config__kv_channels": 5, "dit_config__kv_channels": 5}, "lm_config.kv_channels"),
    "rope_factor_count": ({"lm_config__rope_scaling__short_factor": [1.0, 2.0, 3.0]}, "short_factor"),
    "rope_long_factor_count": ({"lm_config__max_position_embeddings": 512,
                                "lm_config__rope_scaling__long_factor": [1.0, 2.0, 3.0]}, "long_factor"),
    "rope_factor_zero": ({"lm_config__rope_scaling__short_factor": [1.0, 0.0]}, "short_factor"),
    "rope_theta_zero": ({"lm_config__rope_theta": 0}, "rope_theta"),
    "rope_original_max_1": ({"lm_config__rope_scaling__original_max_position_embeddings": 1},
                            "original_max_position_embeddings"),
    "rope_max_pos_zero": ({"lm_config__max_position_embeddings": 0}, "max_position_embeddings"),
    "rms_eps_zero": ({"lm_config__rms_norm_eps": 0.0}, "rms_norm_eps"),
    "dit_hidden_odd": ({"dit_config__hidden_dim": 11}, "dit_config.hidden_dim"),
    "dit_hidden_2": ({"dit_config__hidden_dim": 2}, "dit_config.hidden_dim"),
    "tslm_without_layers": ({"lm_config__num_hidden_layers": 0}, "lm_config.num_hidden_layers"),
    "ralm_without_layers": ({"residual_lm_num_layers": 0}, "residual_lm_num_layers"),
    "negative_ffn": ({"encoder_config__ffn_dim": -1}, "encoder_config.ffn_dim"),
    "negative_layers": ({"dit_config__num_layers": -1}, "dit_config.num_layers"),
    "zero_hidden": ({"lm_config__hidden_size": 0}, "lm_config.hidden_size"),
    # model-level
    "fsq_scale_zero": ({"scalar_quantization_scale": 0}, "scalar_quantization_scale"),
    "fsq_latent_zero": ({"scalar_quantization_latent_dim": 0}, "scalar_quantization_latent_dim"),
    "patch_zero": ({"patch_size": 0}, "patch_size"),
    "no_kv_cache": ({"max_length": 0}, "max_length"),
    "dtype": ({"dtype": "int8"}, "dtype"),
    "no_vocab": ({"lm_config__vocab_size": 0}, "vocab_size"),
    "required_key": ({"lm_config__rope_scaling": DROP}, "rope_scaling"),
    "bad_int": ({"lm_config__hidden_size": "sixteen"}, "hidden_size"),
    "fractional_int": ({"patch_size": 2.5}, "patch_size"),
    "bad_bool": ({"residual_lm_no_rope": 2}, "residual_lm_no_rope"),
    "cfm_range_length": ({"dit_config__cfm_config__ratio_r_neq_t_range": [0.1, 0.2, 0.3]}, "ratio_r_neq_t_range"),
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_invalid_config_names_the_key(name):
    changes, key = REJECTED[name]
    with pytest.raises(CheckpointError) as err:
        VoxCPM2Config.from_dict(variant(**changes))
    assert key in str(err.value), str(err.value)


def test_loader_reports_invalid_config_of_a_folder(tmp_path):
    write_checkpoint(tmp_path, BASE)
    (tmp_path / "config.json").write_text(json.dumps(variant(audio_vae_config__decoder_dim=63)))
    with pytest.raises(CheckpointError, match="decoder_dim"):
        load_voxcpm2(tmp_path)
    with pytest.raises(CheckpointError, match="decoder_dim"):
        load_audio_vae(tmp_path)


def test_tokenizer_larger_than_the_vocabulary(tmp_path, caplog):
    """The reference loads such a folder and fails only on texts reaching the extra ids; so do we, clearly."""
    write_checkpoint(tmp_path, variant(lm_config__vocab_size=110), tokenizer_ids=120)
    with caplog.at_level("WARNING"):
        engine = VoxCPM2Engine.from_pretrained(tmp_path)
    assert "embeds only 110" in caplog.text
    assert engine.synthesize(engine.build("Hi.", seed=1, retry=False, max_len=2, inference_timesteps=1)).size
    with pytest.raises(TextError, match="vocab_size 110"):
        engine.build("H\u00e5.", seed=1)  # id 110


def test_checkpoint_boundaries_win_over_the_config(tmp_path, caplog):
    """``decoder.sr_bin_boundaries`` of the file is what the reference uses (its load_state_dict copies the buffer)."""
    _, vae = write_checkpoint(tmp_path, BASE)
    sd = release_state_dict(vae)
    sd["decoder.sr_bin_boundaries"] = torch.tensor([10000, 50000, 60000], dtype=torch.int32)
    torch.save({"state_dict": sd}, tmp_path / "audiovae.pth")
    with caplog.at_level("WARNING"):
        loaded = load_audio_vae(tmp_path)
    assert "differ from the config" in caplog.text
    assert loaded.decoder.bucket(torch.tensor([48000])).item() == 1  # 48 kHz: bucket 1 of [1e4, 5e4, 6e4]


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
    config = VoxCPM2Config.from_dict(variant(**ACCEPTED[name][0]))
    torch.manual_seed(5)
    model = VoxCPM2Model(config).eval()
    _randomize(model, 6)
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
    _randomize(model, seed + 10)
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


# --- layouts of every mode, odd lengths, and the continuation context ---------------------------------------------

def spec_layout(text: list[int], ref: int, prompt: int) -> list[int]:
    """Token ids (docs/design.md, sequence layouts): ``[103, 0×R, 104]`` (if reference) + ``X + [101]`` + ``0×Q`` (if prompt)."""
    head = [SPECIAL.ref_audio_start] + [0] * ref + [SPECIAL.ref_audio_end] if ref else []
    return head + text + [SPECIAL.audio_start] + [0] * prompt


@pytest.mark.parametrize("ref", [0, 1, 2, 5])
@pytest.mark.parametrize("prompt", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("n_text", [1, 4])
def test_layouts_and_context_follow_the_spec(ref, prompt, n_text):
    p, d = 3, 5
    text = [7 + i for i in range(n_text)]
    ref_patches = torch.arange(ref * p * d, dtype=torch.float32).reshape(ref, p, d) + 1 if ref else None
    prompt_patches = -torch.arange(prompt * p * d, dtype=torch.float32).reshape(prompt, p, d) - 1 if prompt else None
    layout = build_layout(text, p, d, ref_patches, prompt_patches)
    ids = spec_layout(text, ref, prompt)
    assert layout.text_tokens.tolist() == ids
    audio = [0] * len(ids)
    if ref:
        audio[1:1 + ref] = [1] * ref
    if prompt:
        audio[-prompt:] = [1] * prompt
    assert layout.audio_mask.tolist() == audio and layout.text_mask.tolist() == [1 - a for a in audio]
    feats = [torch.zeros(p, d)] * len(ids)
    if ref:
        feats[1:1 + ref] = list(ref_patches)
    if prompt:
        feats[-prompt:] = list(prompt_patches)
    assert torch.equal(layout.audio_feat, torch.stack(feats))
    # context (continuation modes): the last min(3, #audio positions) audio patches — reference ones included when
    # the prompt is shorter than 3 (the reference counts every audio position)
    positions = [i for i, a in enumerate(audio) if a]
    want = torch.stack([feats[i] for i in positions[-3:]]) if prompt else torch.zeros(0, p, d)
    assert torch.equal(layout.context_patches(3), want)


# --- batch == single and two requests at once ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["hidden_not_divisible_by_heads", "patch_3_mean_mode", "decoder_dim_160"])
@torch.inference_mode()
def test_batched_components_equal_single_rows(name):
    config = VoxCPM2Config.from_dict(variant(**ACCEPTED[name][0]))
    torch.manual_seed(2)
    model = VoxCPM2Model(config).eval()
    _randomize(model, 3)
    gen = torch.Generator().manual_seed(4)
    p, d, h = config.patch_size, config.feat_dim, config.lm_config.hidden_size

    def check(tag, batched, single):
        assert_close(batched, torch.cat([single(i) for i in range(2)]), 1e-5, f"{name} {tag}")

    patches = torch.randn(2, 5, p, d, generator=gen)
    check("LocEnc", model.feat_encoder(patches), lambda i: model.feat_encoder(patches[i:i + 1]))
    x = torch.randn(2, 7, h, generator=gen)
    for stack in (model.base_lm, model.residual_lm):
        def run(xx, stack=stack):
            cache = stack.new_cache(8)
            out = [stack(xx[:, :4], cache=cache)] + [stack(xx[:, j:j + 1], cache=cache) for j in range(4, 7)]
            return torch.cat(out, 1)
        check(f"{stack.cfg.stack} cached", run(x), lambda i, run=run: run(x[i:i + 1]))
    vae = AudioVAE(AudioVAEConfig.from_model_config(variant(**ACCEPTED[name][0]))).eval()
    _randomize(vae, 5)
    z = torch.randn(2, d, 6, generator=gen)
    check("VAE decode", vae.decode(z), lambda i: vae.decode(z[i:i + 1]))
    rates = torch.tensor([16000, 48000], dtype=torch.int32)
    check("VAE decode per-row rate", vae.decode(z, sr_cond=rates), lambda i: vae.decode(z[i:i + 1], sr_cond=rates[i:i + 1]))
    wav = torch.randn(2, 2 * vae.hop_length + 3, generator=gen) * 0.2
    check("VAE encode", vae.encode(wav), lambda i: vae.encode(wav[i:i + 1]))


def test_two_requests_of_different_modes_together_equal_alone(tmp_path):
    """Two streams of different modes and lengths, interleaved patch by patch on one engine, equal each alone."""
    write_checkpoint(tmp_path, variant(patch_size=3), seed=9)
    engine = VoxCPM2Engine.from_pretrained(tmp_path)

    def requests():
        return (engine.build("Hi there.", seed=4, retry=False, max_len=4, min_len=0, inference_timesteps=2),
                engine.build("A longer one, ok?", seed=5, retry=False, max_len=3, min_len=0, inference_timesteps=2,
                             reference_wav=prompt_audio(0.7, 3), prompt_wav=prompt_audio(0.5, 4),
                             prompt_text="Yes."))

    alone = [np.concatenate(list(engine.stream(r))) for r in requests()]
    together: list[list[np.ndarray]] = [[], []]
    streams = [engine.stream(r) for r in requests()]
    while streams[0] is not None or streams[1] is not None:
        for k, s in enumerate(streams):
            if s is not None:
                chunk = next(s, None)
                if chunk is None:
                    streams[k] = None
                else:
                    together[k].append(chunk)
    for a, t in zip(alone, together):
        # 1e-5, not 0: requests that share a scheduler step run batched GEMMs, which sum in another order than a
        # request alone (~1e-7; docs/performance.md, "VoxCPM 2 batching"); decisions and noise are the same.
        assert_close(np.concatenate(t), a, 1e-5, "interleaved")
    assert all(np.isfinite(a).all() for a in alone)


def test_written_files_are_the_release_format(tmp_path):
    """The helper writes what a release has: weight-norm pairs and [1, C, 1] Snake alphas in audiovae.pth."""
    write_checkpoint(tmp_path, BASE)
    sd = torch.load(tmp_path / "audiovae.pth", weights_only=True)["state_dict"]
    assert sd["decoder.model.9.weight_g"].shape == (1, 1, 1) and sd["decoder.model.8.alpha"].dim() == 3
    assert sd["decoder.sr_bin_boundaries"].dtype == torch.int32
    assert "stop_head.weight" in load_file(str(tmp_path / "model.safetensors"))
