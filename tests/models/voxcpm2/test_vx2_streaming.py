"""VoxCPM 2 streaming: patches decoded once each by a per-request stateful AudioVAE decoder.

Parity with ``stream_<mode>.safetensors`` (README §6): zero-shot as is; continuation with ``reference_onset=True``
(the reference starts its stream decoder cold). Our default warms the decoder on the prompt tail, so the streamed
concatenation equals the non-streaming waveform in every mode (checked against ``gen_<mode>`` and our own
non-streaming decode).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cadenza.models.voxcpm2.audio_vae_loader import load_audio_vae
from cadenza.models.voxcpm2.generate import GenerationOptions, generate_latents
from cadenza.models.voxcpm2.layouts import SequenceLayout
from cadenza.models.voxcpm2.streaming import PatchDecoder, stream_waveform
from helpers import assert_close, vx2_fixture_dir

GEN_TOL = 2e-3  # README: whole generations
STREAM_TOL = 1e-5  # streamed vs one-shot decoding of the same latents (float rounding only)


@pytest.fixture(scope="module")
def vae(vx2_dir: Path):
    return load_audio_vae(vx2_dir / "tiny_model")


def _layout(g: dict) -> SequenceLayout:
    return SequenceLayout(g["seq_text_token"][0], g["seq_text_mask"][0], g["seq_audio_feat"][0], g["seq_audio_mask"][0])


def _options(case: dict) -> GenerationOptions:
    kw = case["inference_kwargs"]
    return GenerationOptions(min_len=kw["min_len"], max_len=kw["max_len"], inference_timesteps=kw["inference_timesteps"],
                             cfg_value=kw["cfg_value"], context_patches=kw["streaming_prefix_len"] - 1)


def _stream_cases() -> list[str]:
    path = vx2_fixture_dir()
    return sorted(p.stem for p in path.glob("stream_*.safetensors")) if path.is_dir() else []


def _nonstream(model, vae, layout, options, noise) -> np.ndarray:
    result = generate_latents(model, layout, options, noise=noise)
    with torch.no_grad():
        wav = vae.decode(result.latents)[0, 0]
    return wav[result.context_len * model.patch_size * vae.decode_hop_length:].numpy()


@pytest.mark.parametrize("name", _stream_cases())
def test_reference_stream_parity(vx2_model, vae, vx2_dir, vx2_manifest, name):
    """The reference's cold-start streams, chunk for chunk."""
    s, case = load_file(str(vx2_dir / f"{name}.safetensors")), vx2_manifest["generation"][name]
    g = load_file(str(vx2_dir / f"gen_{name.removeprefix('stream_')}.safetensors"))
    steps = []
    chunks = list(stream_waveform(vx2_model, vae, _layout(g), _options(case), noise=s["noise"], reference_onset=True,
                                  steps_out=steps))
    assert [c.size for c in chunks] == case["chunk_samples"]
    assert all(c.dtype == np.float32 for c in chunks)
    assert_close(torch.stack([st.patch for st in steps]), s["step_patch"], GEN_TOL, f"{name} patches")
    assert_close(np.concatenate(chunks), s["wav_out"][0], GEN_TOL, f"{name} waveform (reference onset)")


@pytest.mark.parametrize("name", _stream_cases())
def test_stream_equals_nonstream_with_warm_onset(vx2_model, vae, vx2_dir, vx2_manifest, name):
    """Default streams are the non-streaming audio cut into chunks, continuation included (the reference's are not:
    ``manifest.stream_vs_nonstream_wav_maxabs``)."""
    s, case = load_file(str(vx2_dir / f"{name}.safetensors")), vx2_manifest["generation"][name]
    base = name.removeprefix("stream_")
    g = load_file(str(vx2_dir / f"gen_{base}.safetensors"))
    streamed = np.concatenate(list(stream_waveform(vx2_model, vae, _layout(g), _options(case), noise=s["noise"])))
    whole = _nonstream(vx2_model, vae, _layout(g), _options(case), s["noise"])
    assert_close(streamed, whole, STREAM_TOL, f"{name}: streamed vs one-shot")
    assert_close(streamed, g["wav_out"][0], GEN_TOL, f"{name}: streamed vs reference non-streaming")
    if _layout(g).ends_with_audio:  # the fix matters exactly here
        cold = np.concatenate(list(stream_waveform(vx2_model, vae, _layout(g), _options(case), noise=s["noise"],
                                                   reference_onset=True)))
        assert np.abs(cold - whole).max() > 100 * STREAM_TOL


def test_every_patch_decoded_once(vx2_model, vae, vx2_dir, vx2_manifest, monkeypatch):
    """Each generated patch reaches the decoder exactly once (plus one warm-up call for continuation)."""
    name = next((n for n in _stream_cases() if "continuation" in n), None)
    assert name, "the VoxCPM 2 fixture lacks a continuation stream case (stream_*continuation*)"
    s, case = load_file(str(vx2_dir / f"{name}.safetensors")), vx2_manifest["generation"][name]
    g = load_file(str(vx2_dir / f"gen_{name.removeprefix('stream_')}.safetensors"))
    calls = []
    from cadenza.models.voxcpm2 import audio_vae_streaming

    original = audio_vae_streaming.StreamingAudioVAEDecoder.decode_chunk
    monkeypatch.setattr(audio_vae_streaming.StreamingAudioVAEDecoder, "decode_chunk",
                        lambda self, z: (calls.append(z.shape[-1]), original(self, z))[1])
    layout, options = _layout(g), _options(case)
    chunks = list(stream_waveform(vx2_model, vae, layout, options, noise=s["noise"]))
    context = layout.context_patches(options.context_patches).shape[0]
    p = vx2_model.patch_size
    assert calls == [context * p] + [p] * case["n_patches"]
    assert len(chunks) == case["n_patches"]


def test_decoder_warmup_and_chunking(vx2_model, vae, vx2_dir):
    """PatchDecoder with context == one-shot decode of [context, patches] with the context audio dropped, for single
    patches and multi-patch chunks alike."""
    path = vx2_dir / "gen_ref_continuation.safetensors"
    assert path.is_file(), f"the VoxCPM 2 fixture lacks {path.name}"
    g = load_file(str(path))
    context, patches = g["cache_prompt_audio_feat"][-3:], g["generated_feat"]
    from cadenza.models.voxcpm2.layouts import patches_to_latents

    with torch.no_grad():
        whole = vae.decode(patches_to_latents(torch.cat([context, patches])))[0, 0].numpy()
    whole = whole[context.shape[0] * vx2_model.patch_size * vae.decode_hop_length:]
    with PatchDecoder(vae, context) as dec:
        parts = [dec.decode(patches[:1]), dec.decode(patches[1:3]), *[dec.decode(patches[i:i + 1])
                                                                       for i in range(3, patches.shape[0])]]
    assert dec.closed
    assert_close(np.concatenate(parts), whole, STREAM_TOL, "warm chunked decode")


def test_closing_stream_stops_generation(vx2_model, vae, vx2_dir, vx2_manifest):
    g = load_file(str(vx2_dir / "gen_zero_shot.safetensors"))
    case = vx2_manifest["generation"]["zero_shot"]
    steps = []
    it = stream_waveform(vx2_model, vae, _layout(g), _options(case), noise=g["noise"], steps_out=steps)
    next(it)
    next(it)
    it.close()
    assert len(steps) == 2
    with pytest.raises(StopIteration):
        next(it)
