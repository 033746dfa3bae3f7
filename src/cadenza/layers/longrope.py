"""MiniCPM "LongRoPE" rotary tables (rotate-half convention) and a rotation computed in float32.

LongRoPE divides each rotary frequency by a per-frequency factor (``short_factor`` while the model's
``max_position_embeddings`` does not exceed the pre-training length, ``long_factor`` otherwise) and scales cos/sin
by ``sqrt(1 + ln(max_pos / orig_max) / ln(orig_max))`` (1 when the two lengths are equal).

The reference precomputes a ``[max_pos, head_dim]`` table once; we compute the rows of the requested positions on
demand. Each entry is an elementwise product, so the rows are bit-identical to the table's: the operation order
``(p * (1 / factor)) * inv_freq`` in float32 is kept on purpose. No buffers: nothing to move between devices and
meta-device builds need nothing materialised.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from cadenza.layers.rotary import rotate_half


class LongRoPE(nn.Module):
    """``positions [..., n]`` (int) -> ``(cos, sin)`` each ``[..., n, head_dim]``.

    The tables are built in float32 and then rounded to ``dtype``: the reference casts its precomputed table with
    the model, so a bf16 model really rotates with bf16-rounded cos/sin.
    """

    def __init__(
        self,
        head_dim: int,
        theta: float,
        short_factor: Sequence[float],
        long_factor: Sequence[float],
        max_position_embeddings: int,
        original_max_position_embeddings: int,
    ) -> None:
        super().__init__()
        if head_dim % 2 or len(short_factor) != head_dim // 2 or len(long_factor) != head_dim // 2:
            raise ValueError(f"LongRoPE needs an even head_dim and head_dim/2 factors, got {head_dim}")
        self.head_dim = head_dim
        self.theta = float(theta)
        self.max_position_embeddings = max_position_embeddings
        self.original_max_position_embeddings = original_max_position_embeddings
        long = max_position_embeddings > original_max_position_embeddings
        self.factors = tuple(float(f) for f in (long_factor if long else short_factor))
        ratio = max_position_embeddings / original_max_position_embeddings
        self.scaling_factor = math.sqrt(1 + math.log(ratio) / math.log(original_max_position_embeddings))

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        """``[head_dim / 2]`` float32: ``theta^(-2j / head_dim)``."""
        return 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))

    def forward(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        device = positions.device
        factors = torch.tensor(self.factors, dtype=torch.float32, device=device)
        freqs = (positions.to(torch.float32)[..., None] * (1.0 / factors)) * self.inv_freq(device)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.scaling_factor
        sin = emb.sin() * self.scaling_factor
        return cos.to(dtype), sin.to(dtype)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, theta={self.theta:g}, max_pos={self.max_position_embeddings}, "
                f"orig_max_pos={self.original_max_position_embeddings}, scale={self.scaling_factor:.6g}")


def apply_rotary_fp32(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ``[B, heads, n, head_dim]``, cos/sin ``[n, head_dim]`` or ``[B, 1, n, head_dim]`` -> rotated x (x's dtype).

    The rotation runs in float32 and is cast back (MiniCPM does this; a no-op difference for float32 models).
    """
    dtype = x.dtype
    x = x.to(torch.float32)
    return (x * cos + rotate_half(x) * sin).to(dtype)
