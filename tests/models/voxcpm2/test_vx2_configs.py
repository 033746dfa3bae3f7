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

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.errors import CheckpointError, TextError
from cadenza.models.voxcpm2.audio_vae_loader import load_audio_vae, release_state_dict
from cadenza.models.voxcpm2.config import VoxCPM2Config
from cadenza.models.voxcpm2.loader import load_voxcpm2
from helpers import assert_close
from vx2_small_checkpoints import ACCEPTED, BASE, DROP, one_thread, prompt_audio, variant, write_checkpoint  # noqa: F401 (one_thread: autouse)

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



def test_written_files_are_the_release_format(tmp_path):
    """The helper writes what a release has: weight-norm pairs and [1, C, 1] Snake alphas in audiovae.pth."""
    write_checkpoint(tmp_path, BASE)
    sd = torch.load(tmp_path / "audiovae.pth", weights_only=True)["state_dict"]
    assert sd["decoder.model.9.weight_g"].shape == (1, 1, 1) and sd["decoder.model.8.alpha"].dim() == 3
    assert sd["decoder.sr_bin_boundaries"].dtype == torch.int32
    assert "stop_head.weight" in load_file(str(tmp_path / "model.safetensors"))
