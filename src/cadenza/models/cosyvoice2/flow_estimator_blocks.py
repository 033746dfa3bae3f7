"""Building blocks of the flow estimator U-Net, with the checkpoint's submodule names.

See docs/design.md, "CosyVoice 2 flow".

* ``CausalConv1d``: Conv1d that left-pads ``kernel - 1`` zeros, or with a ``StreamCache`` the previous call's
  committed input tail (incremental inference).
* ``CausalBlock1D`` / ``CausalResnetBlock1D``: Matcha-TTS resnet blocks with causal convs and channel LayerNorm.
* ``BasicTransformerBlock``: the diffusers block as Matcha-TTS configures it (self-attention + exact-GELU FF,
  no cross-attention), keys ``norm1, attn1.to_q/k/v, attn1.to_out.0, norm3, ff.net.0.proj, ff.net.2``.

Every block takes an optional ``cache`` (``StreamCache``); without it the computation is the plain full-sequence
one, with it the input frames continue the cached stream (see ``layers/stream_cache.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.layers.stream_cache import RowStreamCaches, StreamCache

FF_MULT = 4  # diffusers FeedForward default: inner width = 4 x dim
CONV_KERNEL = 3  # every causal conv of the U-Net


class CausalConv1d(nn.Conv1d):
    """Stride-1 Conv1d over ``[B, C, T]`` that only looks back: left-pads ``kernel_size - 1`` zeros."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size, padding=0)
        self.causal_padding = kernel_size - 1

    def forward(self, x: torch.Tensor, cache: StreamCache | None = None) -> torch.Tensor:
        if cache is None:
            return super().forward(F.pad(x, (self.causal_padding, 0), value=0.0))
        return super().forward(cache.left_context(self, x, self.causal_padding))


class Transpose(nn.Module):
    """Swap two dims (lets a LayerNorm sit inside an ``nn.Sequential`` over ``[B, C, T]``)."""

    def __init__(self, dim0: int, dim1: int) -> None:
        super().__init__()
        self.dim0, self.dim1 = dim0, dim1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.transpose(x, self.dim0, self.dim1)


class CausalBlock1D(nn.Module):
    """``Mish(LayerNorm_C(CausalConv1d(x * mask))) * mask`` on ``[B, C_in, T] -> [B, C_out, T]``.

    The ``block`` indices (0 = conv, 2 = LayerNorm) are the checkpoint's.
    """

    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            CausalConv1d(dim, dim_out, CONV_KERNEL), Transpose(1, 2), nn.LayerNorm(dim_out), Transpose(1, 2), nn.Mish()
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: StreamCache | None = None) -> torch.Tensor:
        """x ``[B, C_in, T]``, mask ``[B, 1, T]`` (float) -> ``[B, C_out, T]``."""
        h = self.block[0](x * mask, cache)
        for layer in self.block[1:]:
            h = layer(h)
        return h * mask


class CausalResnetBlock1D(nn.Module):
    """``block2(block1(x) + Linear(Mish(temb))) + Conv1x1(x * mask)``: ``[B, C_in, T] -> [B, C_out, T]``."""

    def __init__(self, dim: int, dim_out: int, time_emb_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = CausalBlock1D(dim, dim_out)
        self.block2 = CausalBlock1D(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, time_emb: torch.Tensor, cache: StreamCache | None = None
    ) -> torch.Tensor:
        """x ``[B, C_in, T]``, mask ``[B, 1, T]``, time_emb ``[B, time_emb_dim]``."""
        h = self.block1(x, mask, cache)
        h = h + self.mlp(time_emb).unsqueeze(-1)
        h = self.block2(h, mask, cache)
        return h + self.res_conv(x * mask)


@dataclass(frozen=True)
class ChunkCausalKeys:
    """The attention pattern of an incremental call under chunk masks with every left chunk visible and no padded
    frame: the queries of each chunk see every key up to the end of their chunk (cached keys included), nothing else.

    Attention then runs per query chunk over exactly those keys, with no mask: the result is the masked one (a
    ``-1e10`` bias contributes exact zeros) but SDPA uses its fused kernel without reading a ``[T, K]`` bias, and the
    keys after a chunk are not multiplied at all. ``spans``: ``(first query, end query, keys)`` per query chunk,
    queries counted from this call's first, keys from the first cached one.
    """

    spans: tuple[tuple[int, int, int], ...]

    @classmethod
    def plan(cls, past: int, new: int, chunk: int) -> ChunkCausalKeys:
        """``new`` queries after ``past`` cached keys, attention chunks of ``chunk`` frames."""
        spans, start = [], 0
        while start < new:
            end = min(new, ((past + start) // chunk + 1) * chunk - past)  # end of the query's chunk, or of the call
            spans.append((start, end, past + end))
            start = end
        return cls(tuple(spans))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """q ``[B, H, T1, D]``, k/v ``[B, H, T2, D]``, additive bias (broadcast to ``[B, H, T1, T2]``) -> ``[B, H, T1, D]``.

    Scale ``1/sqrt(D)``. The reference (diffusers ``AttnProcessor2_0``) calls the same SDPA kernel with the same
    ``-1e10`` bias, which keeps us at float32 round-off from it.
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.0, is_causal=False)


class SelfAttention(nn.Module):
    """diffusers ``Attention`` without cross-attention: q/k/v without bias, ``to_out.0`` with bias."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), -1, self.heads, x.size(-1) // self.heads).transpose(1, 2)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``[B, T, dim]`` -> q, k, v each ``[B, H, T, head_dim]``."""
        return self._heads(self.to_q(x)), self._heads(self.to_k(x)), self._heads(self.to_v(x))

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, cache: StreamCache | None = None) -> torch.Tensor:
        """x ``[B, T, dim]``, bias ``[B, 1, T, T]`` (additive) -> ``[B, T, dim]``.

        With ``cache`` the T positions follow the cached ones and bias is ``[B, 1, T, K]`` for the last ``K <= past + T``
        keys, or a ``ChunkCausalKeys`` plan; the keys/values of the first ``cache.commit`` positions are kept. With
        ``RowStreamCaches`` bias is a list with one such bias or plan per stream (streams may have different cached
        lengths).
        """
        q, k, v = self.project_qkv(x)
        if cache is None:
            out = attend(q, k, v, bias)  # [B, H, T, head_dim]
        elif isinstance(cache, RowStreamCaches):  # several streams: each row attends over its own cached keys
            n = len(cache.caches)
            rows = q.new_empty(q.size(0), q.size(2), q.size(1), q.size(3))  # [B, T, H, D]: the layout to_out reads
            for i, part in enumerate(zip(cache.caches, cache.split(q), cache.split(k), cache.split(v), bias)):
                rows[i::n] = self._attend_cached(*part).transpose(1, 2)
            out = rows.transpose(1, 2)
        else:
            out = self._attend_cached(cache, q, k, v, bias)
        batch, heads, _, head_dim = out.shape
        out = out.transpose(1, 2).reshape(batch, -1, heads * head_dim).to(q.dtype)
        return self.to_out[1](self.to_out[0](out))


    def _attend_cached(
        self, cache: StreamCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        bias: torch.Tensor | ChunkCausalKeys | None,
    ) -> torch.Tensor:
        """q/k/v ``[B, H, T, D]`` of positions after ``cache``'s; keeps the first ``cache.commit`` keys/values.
        ``bias``: additive, over the last keys it covers, or a ``ChunkCausalKeys`` plan (no mask at all)."""
        kv = cache.kv(self)
        past = kv.length
        k, v = kv.append(0, k, v)
        if isinstance(bias, ChunkCausalKeys):
            parts = [attend(q[:, :, a:b], k[:, :, :n], v[:, :, :n], None) for a, b, n in bias.spans]
            out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
        else:
            if bias is not None and bias.size(-1) < k.size(2):  # limited left context: only the keys bias covers
                k, v = k[:, :, k.size(2) - bias.size(-1) :], v[:, :, v.size(2) - bias.size(-1) :]
            out = attend(q, k, v, bias)
        kv.crop(past + cache.commit)
        return out


class GELUProjection(nn.Module):
    """``gelu(Linear(x))`` with exact (erf) GELU; diffusers' ``GELU`` module (weights under ``proj``)."""

    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    """``net = [GELUProjection(dim, 4 dim), Dropout, Linear(4 dim, dim)]``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        inner = FF_MULT * dim
        self.net = nn.ModuleList([GELUProjection(dim, inner), nn.Dropout(0.0), nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.net:
            x = module(x)
        return x


class BasicTransformerBlock(nn.Module):
    """``x += Attn(LN1(x)); x += FF(LN3(x))`` on ``[B, T, dim]``."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = SelfAttention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, cache: StreamCache | None = None) -> torch.Tensor:
        """x ``[B, T, dim]``, bias additive attention bias ``[B, 1, T, T]`` -> ``[B, T, dim]``."""
        x = self.attn1(self.norm1(x), bias, cache) + x
        return self.ff(self.norm3(x)) + x


class Downsample1D(nn.Module):
    """Matcha's x2 time down-sampling ``Conv1d(k3, stride 2, pad 1)``; only used by multi-level U-Nets."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 3, 2, 1)

    def forward(self, x: torch.Tensor, cache: StreamCache | None = None) -> torch.Tensor:
        if cache is not None:
            raise ValueError(f"{type(self).__name__} looks ahead and cannot run incrementally")
        return self.conv(x)


class Upsample1D(nn.Module):
    """Matcha's x2 time up-sampling ``ConvTranspose1d(k4, stride 2, pad 1)``; only used by multi-level U-Nets."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(dim, dim, 4, 2, 1)

    def forward(self, x: torch.Tensor, cache: StreamCache | None = None) -> torch.Tensor:
        if cache is not None:
            raise ValueError(f"{type(self).__name__} looks ahead and cannot run incrementally")
        return self.conv(x)
