"""VoxCPM 2 AudioVAE V2: parity with the reference fixtures (encode, decode, sample-rate buckets, streaming),
the full-size release layout on the ``meta`` device, streaming properties, loading and bad input.

Fixtures: ``$CADENZA_FIXTURES_VOXCPM2`` (default ``<repo>/../shared/fixtures/voxcpm2``), README §4; sizes, chunk
bounds and parameter counts come from its ``manifest.json`` and ``tiny_model/config.json``.
"""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from cadenza.errors import AudioError, CheckpointError, InputError
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.audio_vae_loader import (
    checkpoint_key_shapes,
    find_audio_vae_weights,
    load_audio_vae,
    load_audio_vae_state_dict,
)
from cadenza.models.voxcpm2.audio_vae_streaming import StreamingAudioVAEDecoder
from helpers import assert_close

# README: <= 1e-5 abs for single blocks. The VAE is a pure conv stack (no recurrence); we measure < 1.1e-6.
VAE_TOL = 1e-5
# Streaming vs one-shot on our own code: only summation order differs (manifest: 2.7e-7 in the reference).
STREAM_TOL = 1e-5


@pytest.fixture(scope="module")
def model_config(vx2_dir) -> dict:
    return json.loads((vx2_dir / "tiny_model" / "config.json").read_text())


@pytest.fixture(scope="module")
def arrays(vx2_dir) -> dict[str, torch.Tensor]:
    return load_file(str(vx2_dir / "audiovae.safetensors"))


@pytest.fixture(scope="module")
def vae(vx2_dir) -> AudioVAE:
    return load_audio_vae(vx2_dir / "tiny_model")


def _stream(vae: AudioVAE, z: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    with StreamingAudioVAEDecoder(vae) as dec:
        return torch.cat([dec.decode_chunk(z[..., a:b]) for a, b in zip(bounds[:-1], bounds[1:])], dim=-1)


def _random_bounds(total: int, gen: torch.Generator, max_chunk: int) -> list[int]:
    bounds = [0]
    while bounds[-1] < total:
        bounds.append(min(total, bounds[-1] + int(torch.randint(1, max_chunk + 1, (1,), generator=gen))))
    return bounds


# ------------------------------------------------------------------ parity with the reference


@torch.inference_mode()
def test_encode_matches_reference(vae, arrays):
    wav = arrays["enc_wav_in"]
    mu, logvar = vae.encode_mu_logvar(wav, vae.sample_rate)
    assert mu.shape[-1] == math.ceil(wav.shape[-1] / vae.hop_length)
    assert_close(mu, arrays["enc_latent_out"], VAE_TOL, "encode mu")
    assert_close(logvar, arrays["enc_logvar_out"], VAE_TOL, "encode logvar")
    assert torch.equal(vae.encode(wav), mu)
    assert torch.equal(vae.encode(wav.unsqueeze(1)), mu)  # [B, 1, N] accepted too


@torch.inference_mode()
def test_decode_matches_reference(vae, arrays):
    z = arrays["dec_latent_in"]
    out = vae.decode(z)
    assert out.shape == (z.shape[0], 1, z.shape[-1] * vae.decode_hop_length)
    assert_close(out, arrays["dec_wav_out"], VAE_TOL, "decode (default 48 kHz condition)")
    assert_close(vae.decode(z, vae.out_sample_rate), arrays["dec_wav_out"], VAE_TOL, "decode explicit rate")


@torch.inference_mode()
def test_decode_sample_rate_buckets_match_reference(vae, arrays):
    names = [k for k in arrays if re.fullmatch(r"dec_wav_out_sr\d+", k)]
    assert names, "fixture has no sample-rate-conditioned decodes"
    z = arrays["dec_latent_in"]
    for name in names:
        sr = int(name.removeprefix("dec_wav_out_sr"))
        assert_close(vae.decode(z, sr), arrays[name], VAE_TOL, name)
        assert_close(vae.decode(z, torch.tensor([sr])), arrays[name], VAE_TOL, f"{name} (tensor)")


@torch.inference_mode()
def test_roundtrip_matches_reference(vae, arrays):
    assert_close(vae.decode(arrays["enc_latent_out"]), arrays["roundtrip_wav_out"], VAE_TOL, "decode(encode)")


@torch.inference_mode()
def test_streaming_by_patch_matches_reference(vae, arrays, model_config):
    z = arrays["dec_latent_in"]
    patch = model_config["patch_size"]
    out = _stream(vae, z, list(range(0, z.shape[-1], patch)) + [z.shape[-1]])
    assert_close(out, arrays["dec_stream_patch4_wav_out"], VAE_TOL, "streaming, one patch per chunk")
    assert_close(out, vae.decode(z), STREAM_TOL, "streaming vs one-shot")


@torch.inference_mode()
def test_streaming_irregular_matches_reference(vae, arrays, vx2_manifest):
    z = arrays["dec_latent_in"]
    bounds = vx2_manifest["vae_stream_irregular_bounds"]
    assert bounds[0] == 0 and bounds[-1] == z.shape[-1]
    out = _stream(vae, z, bounds)
    assert_close(out, arrays["dec_stream_irregular_wav_out"], VAE_TOL, "streaming, irregular chunks")
    assert_close(out, vae.decode(z), STREAM_TOL, "streaming vs one-shot")


# ------------------------------------------------------------------ release layout


def test_full_size_release_layout_on_meta():
    cfg = AudioVAEConfig.official()
    with torch.device("meta"):
        vae = AudioVAE(cfg)
    shapes = checkpoint_key_shapes(vae)
    assert len(shapes) == 312  # 311 float tensors + the int32 buffer
    expected = {  # docs/design.md, "VoxCPM 2 AudioVAE"
        "encoder.block.0.weight_v": (128, 1, 7),
        "encoder.block.1.block.0.block.0.alpha": (1, 128, 1),
        "encoder.block.1.block.2.block.1.weight_v": (128, 1, 7),
        "encoder.block.1.block.0.block.3.weight_v": (128, 128, 1),
        "encoder.block.4.block.3.alpha": (1, 1024, 1),
        "encoder.block.4.block.4.weight_v": (2048, 1024, 16),
        "encoder.fc_mu.weight_g": (64, 1, 1),
        "encoder.fc_mu.weight_v": (64, 2048, 3),
        "encoder.fc_logvar.weight_v": (64, 2048, 3),
        "decoder.model.0.weight_v": (64, 1, 7),
        "decoder.model.1.weight_v": (2048, 64, 1),
        "decoder.model.2.block.0.alpha": (1, 2048, 1),
        "decoder.model.2.block.1.weight_v": (2048, 1024, 16),
        "decoder.model.2.block.1.weight_g": (2048, 1, 1),
        "decoder.model.2.block.2.block.1.weight_v": (1024, 1, 7),
        "decoder.model.4.block.1.weight_v": (512, 256, 10),
        "decoder.model.7.block.4.block.3.weight_v": (32, 32, 1),
        "decoder.model.8.alpha": (1, 32, 1),
        "decoder.model.9.weight_v": (1, 32, 7),
        "decoder.model.9.bias": (1,),
        "decoder.sr_cond_model.2.scale_embed.weight": (4, 2048),
        "decoder.sr_cond_model.7.bias_embed.weight": (4, 64),
        "decoder.sr_bin_boundaries": (3,),
    }
    for key, shape in expected.items():
        assert tuple(shapes[key]) == shape, key
    assert vae.decoder.sr_bin_boundaries.dtype == torch.int32
    n = {p: sum(math.prod(s) for k, s in shapes.items() if k.startswith(p) and k != "decoder.sr_bin_boundaries")
         for p in ("encoder.", "decoder.")}
    assert (n["encoder."], n["decoder."]) == (48_435_072, 45_778_882)  # docs/design.md, "VoxCPM 2 AudioVAE"
    assert (cfg.hop_length, cfg.decode_hop_length, cfg.encoder_out_dim, cfg.decoder_out_dim) == (640, 1920, 2048, 32)


def test_tiny_checkpoint_layout(vx2_dir, vae, vx2_manifest):
    sd = torch.load(vx2_dir / "tiny_model" / "audiovae.pth", map_location="cpu", weights_only=True)["state_dict"]
    shapes = checkpoint_key_shapes(vae)
    assert {k: tuple(v.shape) for k, v in sd.items()} == {k: tuple(s) for k, s in shapes.items()}
    assert sum(v.numel() for v in sd.values() if v.is_floating_point()) == vx2_manifest["tiny_param_counts"]["audio_vae"]
    assert [k for k, v in sd.items() if not v.is_floating_point()] == ["decoder.sr_bin_boundaries"]


# ------------------------------------------------------------------ streaming properties


def _random_vae(cfg: AudioVAEConfig, seed: int) -> AudioVAE:
    torch.manual_seed(seed)
    vae = AudioVAE(cfg).eval()
    with torch.no_grad():  # non-trivial Snake/FiLM values so every path matters
        for name, p in vae.named_parameters():
            if name.endswith("alpha"):
                p.uniform_(0.5, 1.5)
            elif "scale_embed" in name:
                p.normal_(1.0, 0.2)
            elif "bias_embed" in name:
                p.normal_(0.0, 0.1)
    return vae


SMALL_CONFIGS = {
    "depthwise": AudioVAEConfig(encoder_dim=2, encoder_rates=(2, 4), latent_dim=6, decoder_dim=32,
                                decoder_rates=(3, 2, 2, 2), sample_rate=16000, out_sample_rate=48000),
    "dense_no_film": AudioVAEConfig(encoder_dim=2, encoder_rates=(4,), latent_dim=5, decoder_dim=16,
                                    decoder_rates=(5, 2), depthwise=False, sample_rate=8000, out_sample_rate=20000,
                                    sr_bin_boundaries=None),
}


@pytest.mark.parametrize("name", sorted(SMALL_CONFIGS))
@torch.inference_mode()
def test_streaming_random_latents_equals_full_decode(name):
    cfg = SMALL_CONFIGS[name]
    vae = _random_vae(cfg, seed=len(name))
    gen = torch.Generator().manual_seed(7)
    z = torch.randn(2, cfg.latent_dim, 23, generator=gen)
    full = vae.decode(z)
    for max_chunk in (1, 4, 9):
        bounds = _random_bounds(z.shape[-1], gen, max_chunk)
        assert_close(_stream(vae, z, bounds), full, STREAM_TOL, f"{name} chunks {bounds}")


@torch.inference_mode()
def test_streaming_random_latents_fixture_model(vae, model_config):
    gen = torch.Generator().manual_seed(11)
    z = torch.randn(1, vae.latent_dim, 5 * model_config["patch_size"], generator=gen)
    patch = model_config["patch_size"]
    assert_close(_stream(vae, z, list(range(0, z.shape[-1] + 1, patch))), vae.decode(z), STREAM_TOL, "by patch")


@torch.inference_mode()
def test_streaming_reset_close_and_independence(vae, model_config):
    gen = torch.Generator().manual_seed(3)
    p = model_config["patch_size"]
    a = torch.randn(1, vae.latent_dim, 3 * p, generator=gen)
    b = torch.randn(1, vae.latent_dim, 3 * p, generator=gen)
    ref_a, ref_b = vae.decode(a), vae.decode(b)

    dec = StreamingAudioVAEDecoder(vae)
    first = dec.decode_chunk(a[..., :p])
    dec.decode_chunk(a[..., p:])
    assert dec.frames_decoded == a.shape[-1] and dec.samples_decoded == ref_a.shape[-1]
    dec.reset()  # a new stream starts from silence: same output as the first chunk of a fresh stream
    assert dec.frames_decoded == 0
    assert_close(dec.decode_chunk(a[..., :p]), first, 0.0, "after reset")

    # Two streams interleaved on one model do not disturb each other.
    s1, s2 = StreamingAudioVAEDecoder(vae), StreamingAudioVAEDecoder(vae)
    out1, out2 = [], []
    for k in range(0, a.shape[-1], p):
        out1.append(s1.decode_chunk(a[..., k:k + p]))
        out2.append(s2.decode_chunk(b[..., k:k + p]))
    assert_close(torch.cat(out1, -1), ref_a, STREAM_TOL, "stream a")
    assert_close(torch.cat(out2, -1), ref_b, STREAM_TOL, "stream b")

    with pytest.raises(InputError, match="batch size changed"):
        s1.decode_chunk(torch.cat([a, a])[..., :p])
    dec.close()
    dec.close()  # idempotent
    assert dec.closed
    with pytest.raises(InputError, match="closed"):
        dec.decode_chunk(a[..., :p])
    with pytest.raises(InputError, match="closed"):
        dec.reset()
    with StreamingAudioVAEDecoder(vae) as ctx:
        ctx.decode_chunk(a[..., :1])
    assert ctx.closed


# ------------------------------------------------------------------ bad input


@torch.inference_mode()
def test_bad_latents_raise_input_error(vae):
    d = vae.latent_dim
    with pytest.raises(InputError, match=f"{d} channels"):
        vae.decode(torch.zeros(1, d + 1, 4))
    with pytest.raises(InputError, match=r"\[B, T, D\]"):
        vae.decode(torch.zeros(1, 4, d))
    with pytest.raises(InputError, match="empty"):
        vae.decode(torch.zeros(1, d, 0))
    with pytest.raises(InputError, match="channels first"):
        vae.decode(torch.zeros(d, 4))
    with pytest.raises(InputError, match="floating"):
        vae.decode(torch.zeros(1, d, 4, dtype=torch.int64))
    with pytest.raises(InputError, match="sr_cond"):
        vae.decode(torch.zeros(1, d, 4), sr_cond=-16000)
    with pytest.raises(InputError, match="sr_cond"):
        vae.decode(torch.zeros(1, d, 4), sr_cond=torch.tensor([48000.0]))
    with StreamingAudioVAEDecoder(vae) as dec:
        with pytest.raises(InputError, match=f"{d} channels"):
            dec.decode_chunk(torch.zeros(1, d - 1, 4))
        with pytest.raises(InputError, match="empty"):
            dec.decode_chunk(torch.zeros(1, d, 0))


@torch.inference_mode()
def test_bad_audio_raises_input_error(vae):
    with pytest.raises(InputError, match="empty"):
        vae.encode(torch.zeros(1, 0))
    with pytest.raises(InputError, match="resample"):
        vae.encode(torch.zeros(1, 100), vae.sample_rate + 1)
    with pytest.raises(InputError, match="mono"):
        vae.encode(torch.zeros(1, 2, 100))
    with pytest.raises(AudioError, match="NaN"):
        vae.encode(torch.full((1, 100), float("nan")))
    assert vae.encode(torch.zeros(1, 1)).shape == (1, vae.latent_dim, 1)  # one sample still makes a frame


# ------------------------------------------------------------------ loading and config


def test_safetensors_weights_take_priority_and_match(vx2_dir, vae, tmp_path):
    sd = torch.load(vx2_dir / "tiny_model" / "audiovae.pth", map_location="cpu", weights_only=True)["state_dict"]
    shutil.copy(vx2_dir / "tiny_model" / "config.json", tmp_path / "config.json")
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "audiovae.safetensors"))
    (tmp_path / "audiovae.pth").write_bytes(b"not a checkpoint")  # must not be read
    assert find_audio_vae_weights(tmp_path).name == "audiovae.safetensors"
    other = load_audio_vae(tmp_path)
    for (k, v), (k2, v2) in zip(vae.state_dict().items(), other.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


def test_parametrization_naming_loads(vx2_dir, vae):
    sd = torch.load(vx2_dir / "tiny_model" / "audiovae.pth", map_location="cpu", weights_only=True)["state_dict"]
    renamed = {k.replace(".weight_g", ".parametrizations.weight.original0")
               .replace(".weight_v", ".parametrizations.weight.original1"): v for k, v in sd.items()}
    other = AudioVAE(vae.cfg)
    load_audio_vae_state_dict(other, renamed, "renamed")
    assert all(torch.equal(a, b) for a, b in zip(vae.state_dict().values(), other.state_dict().values()))


def test_strict_key_check_lists_problems(vx2_dir, vae):
    sd = torch.load(vx2_dir / "tiny_model" / "audiovae.pth", map_location="cpu", weights_only=True)["state_dict"]
    bad = dict(sd)
    del bad["decoder.model.9.bias"]
    bad["decoder.extra.weight"] = torch.zeros(1)
    bad["encoder.fc_mu.weight_v"] = torch.zeros(1, 2, 3)
    with pytest.raises(CheckpointError) as err:
        load_audio_vae_state_dict(AudioVAE(vae.cfg), bad, "bad.pth")
    msg = str(err.value)
    for part in ("missing keys (1): decoder.model.9.bias", "unexpected keys (1): decoder.extra.weight",
                 "encoder.fc_mu.weight_v (1, 2, 3) !="):
        assert part in msg
    short = dict(sd)
    short["decoder.sr_bin_boundaries"] = sd["decoder.sr_bin_boundaries"][:-1]
    with pytest.raises(CheckpointError, match="sr_bin_boundaries"):
        load_audio_vae_state_dict(AudioVAE(vae.cfg), short, "short.pth")
    # other values (same count): the file's boundaries are used, as the reference's load_state_dict does
    other = dict(sd)
    other["decoder.sr_bin_boundaries"] = sd["decoder.sr_bin_boundaries"] + 1
    loaded = AudioVAE(vae.cfg)
    load_audio_vae_state_dict(loaded, other, "other.pth")
    assert torch.equal(loaded.decoder.sr_bin_boundaries, other["decoder.sr_bin_boundaries"])


def test_missing_files_raise_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_audio_vae(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="config.json"):
        load_audio_vae(tmp_path)
    with pytest.raises(CheckpointError, match="audiovae"):
        load_audio_vae(tmp_path, config=AudioVAEConfig.official())


def test_config_reading_and_validation(model_config):
    cfg = AudioVAEConfig.from_model_config(model_config)
    vc = model_config["audio_vae_config"]
    assert (cfg.encoder_dim, list(cfg.encoder_rates), cfg.latent_dim) == (
        vc["encoder_dim"], vc["encoder_rates"], vc["latent_dim"])
    assert (cfg.decoder_dim, list(cfg.decoder_rates)) == (vc["decoder_dim"], vc["decoder_rates"])
    assert cfg.latent_dim == model_config["feat_dim"]
    assert AudioVAEConfig.from_model_config({}) == AudioVAEConfig.official()
    assert AudioVAEConfig.from_dict({"unknown_key": 1, "encoder_rates": [2, 5, 8, 8]}) == AudioVAEConfig.official()
    assert AudioVAEConfig.from_dict({"latent_dim": None}).latent_dim == 128 * 2**4
    for bad in ({"encoder_dim": 0}, {"decoder_rates": []}, {"decoder_dim": 63}, {"use_noise_block": True},
                {"cond_type": "concat"}, {"cond_type": "film"}, {"sr_bin_boundaries": ["low"]},
                {"out_sample_rate": 0}, {"depthwise": "maybe"}, {"encoder_rates": [2, 2.5]}):
        with pytest.raises(CheckpointError, match="audio_vae_config"):
            AudioVAEConfig.from_dict(bad)
    # the reference builds and runs these (tests/models/voxcpm2/test_vx2_configs.py runs them end to end)
    for good in ({"decoder_dim": 160}, {"decoder_dim": 100}, {"sr_bin_boundaries": [3, 2]}, {"sr_bin_boundaries": []},
                 {"out_sample_rate": 44100}, {"depthwise": "yes"}, {"encoder_rates": []}, {"cond_type": "add"},
                 {"cond_type": "concat", "cond_out_layer": True}, {"decoder_dim": "2048"}):
        AudioVAEConfig.from_dict(good)
