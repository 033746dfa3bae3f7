"""VoxCPM 2 on configurations other than the parity fixture's (issue #19): the sequence layouts of every mode at
odd lengths and the continuation context follow the spec, batched components equal single rows, and two requests of
different modes together equal each alone (tests/vx2_small_checkpoints.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.layouts import build_layout
from helpers import assert_close
from vx2_small_checkpoints import (  # noqa: F401 (one_thread: autouse)
    ACCEPTED,
    SPECIAL,
    accepted_model,
    one_thread,
    prompt_audio,
    randomize,
    variant,
    write_checkpoint,
)

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
    config, model = accepted_model(name, 2)
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
    randomize(vae, 5)
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
