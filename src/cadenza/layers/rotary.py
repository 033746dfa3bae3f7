"""Rotary position embedding (RoPE), rotate-half convention (GPT-NeoX / HF Llama / Qwen2).

Positions are passed explicitly (``[B, T]``) rather than derived from a running offset, so that a batch of
requests whose caches have different lengths can be decoded together. The inverse frequencies are recomputed on
every call (``head_dim / 2`` values) instead of being stored: no buffers means nothing to move between devices,
nothing left on the ``meta`` device after ``load_state_dict(assign=True)``, and state dicts stay parameters-only.
"""

from __future__ import annotations

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dim (split into halves, not interleaved pairs)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """Computes ``cos``/``sin`` tables for given positions and applies them to queries and keys."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary head_dim must be even, got {head_dim}")
        self.head_dim = head_dim
        self.theta = theta

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        """``[head_dim / 2]`` float32, computed like HF's ``_compute_default_rope_parameters``."""
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        return 1.0 / (self.theta**exponent)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """positions ``[B, T]`` (int) -> ``(cos, sin)`` each ``[B, T, head_dim]`` in ``dtype``.

        The angle table is always built in float32 (a single product per entry, as HF does) whatever ``dtype`` is.
        """
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta:g}"


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ``[B, heads, T, head_dim]``, cos/sin ``[B, T, head_dim]`` -> rotated x, same shape."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin
