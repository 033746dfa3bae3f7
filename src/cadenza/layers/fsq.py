"""Finite scalar quantisation bottleneck (FSQ with a linear projection on each side).

``codes = round(scale * tanh(in_proj(h)))`` are integers in ``[-scale, scale]`` (``2 * scale + 1`` levels per
latent dim); the output is ``out_proj(codes / scale)``. ``torch.round`` rounds halves to even, as the reference.
In training mode the straight-through estimator passes gradients through the rounding (same forward value).
"""

from __future__ import annotations

import torch
from torch import nn


class ScalarQuantizer(nn.Module):
    """``[..., in_dim] -> [..., out_dim]`` through a ``latent_dim``-wide quantised bottleneck."""

    def __init__(self, in_dim: int, out_dim: int, latent_dim: int, scale: int) -> None:
        super().__init__()
        if scale <= 0:
            raise ValueError(f"FSQ scale must be positive, got {scale}")
        self.scale = scale
        self.in_proj = nn.Linear(in_dim, latent_dim)
        self.out_proj = nn.Linear(latent_dim, out_dim)

    def codes(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., in_dim]`` -> integer-valued codes ``[..., latent_dim]`` (same float dtype)."""
        return torch.round(torch.tanh(self.in_proj(hidden)) * self.scale)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        z = torch.tanh(self.in_proj(hidden))
        quantized = torch.round(z * self.scale) / self.scale
        if self.training:
            quantized = z + (quantized - z).detach()  # straight-through estimator
        return self.out_proj(quantized)

    def extra_repr(self) -> str:
        return f"scale={self.scale}"
