"""Diffusion time embeddings: a sinusoidal feature of a scalar time and the MLP that follows it.

``SinusoidalTimeEmbedding(dim)(t)`` = ``[sin(s t f_j), cos(s t f_j)]`` with ``f_j = exp(-j ln(10000) / (dim/2 - 1))``
and ``s = 1000``, computed in the input's dtype (in bf16 the frequencies are bf16 too, as in VoxCPM's reference), or
with float32 frequencies (``float32_frequencies``: Matcha's, CosyVoice 2's flow), whatever the input's dtype.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class SinusoidalTimeEmbedding(nn.Module):
    """t ``[N]`` (or a scalar) -> ``[N, dim]`` in t's dtype (``float32_frequencies``: in the wider of t's and
    float32). No parameters."""

    def __init__(self, dim: int, scale: float = 1000.0, float32_frequencies: bool = False) -> None:
        super().__init__()
        if dim % 2 or dim < 4:
            raise ValueError(f"sinusoidal time embedding needs an even dim >= 4, got {dim}")
        self.dim = dim
        self.scale = scale
        self.float32_frequencies = float32_frequencies

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        if t.ndim < 1:
            t = t.unsqueeze(0)
        half = self.dim // 2
        dtype = torch.float32 if self.float32_frequencies else t.dtype
        freqs = torch.exp(torch.arange(half, dtype=dtype, device=t.device) * -(math.log(10000) / (half - 1)))
        emb = self.scale * t.unsqueeze(1) * freqs.unsqueeze(0)
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class TimestepMLP(nn.Module):
    """``Linear(in, d) -> SiLU -> Linear(d, out)`` (diffusers ``TimestepEmbedding`` names ``linear_1``/``linear_2``)."""

    def __init__(self, in_channels: int, time_embed_dim: int, out_dim: int | None = None) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(time_embed_dim, out_dim or time_embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in] -> [..., out]``."""
        return self.linear_2(self.act(self.linear_1(x)))
