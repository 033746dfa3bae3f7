"""Small VoxCPM 2 checkpoints written in the release's folder layout from random weights, for the tests of
configurations other than the parity fixture's (issue #19: tests/models/voxcpm2/test_vx2_configs.py,
test_vx2_spec_computation.py, test_vx2_layouts_batching.py): ``BASE`` and its ``variant`` s, ``ACCEPTED`` (the
configurations the reference builds and runs, each on the boundary of one of our checks), the checkpoint writer
and a prompt signal."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.audio_vae_loader import release_state_dict
from cadenza.models.voxcpm2.config import SpecialTokens, VoxCPM2Config
from cadenza.models.voxcpm2.model import VoxCPM2Model
from helpers import one_torch_thread

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


def with_changes(raw: dict, **changes) -> dict:
    """A copy of the config ``raw`` with ``a__b__c=value`` changes (``DROP`` removes the key)."""
    data = copy.deepcopy(raw)
    for dotted, value in changes.items():
        node, *path = data, *dotted.split("__")
        for key in path[:-1]:
            node = node[key]
        if value is DROP:
            node.pop(path[-1])
        else:
            node[path[-1]] = value
    return data


def variant(**changes) -> dict:
    """BASE with ``a__b__c=value`` changes (``DROP`` removes the key)."""
    return with_changes(BASE, **changes)


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():  # tiny models (tests/helpers.py)
        yield


# --- writing a checkpoint folder in the release's layout -----------------------------------------------------------

def write_tokenizer(directory: Path, n_ids: int = 120) -> None:
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


def randomize(module: torch.nn.Module, seed: int) -> None:
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
    write_tokenizer(directory, tokenizer_ids)
    torch.manual_seed(seed)
    model = VoxCPM2Model(VoxCPM2Config.from_dict(config)).eval()
    vae = AudioVAE(AudioVAEConfig.from_model_config(config)).eval()
    randomize(model, seed + 1)
    randomize(vae, seed + 2)
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


def accepted_model(name: str, seed: int) -> tuple[VoxCPM2Config, VoxCPM2Model]:
    """The ``ACCEPTED[name]`` configuration's model with random weights (``seed``; trivial inits randomised with
    ``seed + 1``)."""
    config = VoxCPM2Config.from_dict(variant(**ACCEPTED[name][0]))
    torch.manual_seed(seed)
    model = VoxCPM2Model(config).eval()
    randomize(model, seed + 1)
    return config, model
