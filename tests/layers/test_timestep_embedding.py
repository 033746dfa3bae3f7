"""The diffusion time embedding both flows share: Matcha's formula, and the two precisions their references use."""

from __future__ import annotations

import math

import pytest
import torch

from cadenza.layers.timestep_embedding import SinusoidalTimeEmbedding


def test_matches_the_formula_for_a_batch_and_a_scalar():
    t = torch.tensor([0.0, 0.25, 1.0])
    emb = SinusoidalTimeEmbedding(8)(t)
    freqs = torch.tensor([math.exp(-j * math.log(10000) / 3) for j in range(4)])
    angles = 1000 * t[:, None] * freqs[None]
    torch.testing.assert_close(emb, torch.cat([angles.sin(), angles.cos()], dim=1))
    assert SinusoidalTimeEmbedding(8)(torch.tensor(0.25)).shape == (1, 8)
    with pytest.raises(ValueError, match="even dim"):
        SinusoidalTimeEmbedding(7)


def test_bf16_times_use_bf16_or_float32_frequencies_as_each_reference_does():
    """VoxCPM's reference computes the frequencies in the input's dtype; Matcha's (CosyVoice 2's flow) in float32,
    so a bf16 time gives float32 features there: a flow run in bf16 keeps the reference's time features."""
    t = torch.tensor([0.37, 0.81])
    exact = SinusoidalTimeEmbedding(320)(t)
    matcha = SinusoidalTimeEmbedding(320, float32_frequencies=True)(t.bfloat16())
    voxcpm = SinusoidalTimeEmbedding(320)(t.bfloat16())
    assert matcha.dtype == torch.float32 and voxcpm.dtype == torch.bfloat16
    assert (matcha - exact).abs().max() < (voxcpm.float() - exact).abs().max()
