"""Snake activation (Liu et al. 2020, as used by BigVGAN / HiFT)."""

from __future__ import annotations

import torch
from torch import nn


class Snake(nn.Module):
    """``x + 1 / (alpha + eps) * sin(alpha * x)^2`` with a learned per-channel ``alpha`` (linear scale).

    Args:
        channels: number of channels C.
        eps: added to ``alpha`` before the division, so a zero ``alpha`` does not divide by zero.

    Shapes: ``[B, C, T] -> [B, C, T]``.
    """

    def __init__(self, channels: int, eps: float = 1e-9) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
        return x + (1.0 / (alpha + self.eps)) * torch.pow(torch.sin(x * alpha), 2)
