"""Grouped-query causal self-attention with rotary positions and an optional KV cache (Qwen2 / Llama layout)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.layers.kv_cache import KVCache
from cadenza.layers.kv_pool import PooledStep
from cadenza.layers.rotary import apply_rotary


def causal_mask_with_past(n_new: int, past: int, device: torch.device) -> torch.Tensor:
    """Bool ``[n_new, past + n_new]``: query i (absolute position past+i) may attend keys 0..past+i."""
    return torch.ones(n_new, past + n_new, dtype=torch.bool, device=device).tril(diagonal=past)


class GQASelfAttention(nn.Module):
    """Multi-head self-attention where ``num_heads`` query heads share ``num_kv_heads`` key/value heads.

    Parameter names (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``) match HF ``Qwen2Attention``. Qwen2 has biases on
    q/k/v and none on the output projection; both are configurable. The shared key/value heads go to SDPA as they
    are (``enable_gqa``): repeating them per query head copied every cached key and value on every step.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        qkv_bias: bool = True,
        out_bias: bool = False,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=out_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | list[KVCache] | PooledStep | None = None,
        layer_idx: int = 0,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x ``[B, n, hidden]``, cos/sin ``[B, n, head_dim]`` (rotary tables of the n new positions) -> ``[B, n, hidden]``.

        Without a cache the n positions attend causally among themselves. With a cache holding ``past`` positions
        the new keys/values are appended first and query i attends keys ``0 .. past + i``. ``attn_mask`` (bool,
        True = attend, broadcastable to ``[B, heads, n, past + n]``) overrides the causal rule, e.g. for padded
        batches.
        """
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        gqa = self.num_heads != self.num_kv_heads
        if isinstance(cache, PooledStep):  # B requests in one pool: one store, one gather, one masked attention
            keys, values, mask = cache.attend_inputs(layer_idx, k, v)
            out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask,
                                                 enable_gqa=gqa)
            return self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))
        if isinstance(cache, list):
            out = self._attend_per_row(q, k, v, cache, layer_idx)
            return self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))
        past = 0
        if cache is not None:
            past = cache.layer_length(layer_idx)
            k, v = cache.append(layer_idx, k, v)
        is_causal = False
        if attn_mask is None:
            if past == 0:
                is_causal = n > 1
            elif n > 1:  # SDPA's is_causal aligns the triangle top-left, wrong when keys include a past
                attn_mask = causal_mask_with_past(n, past, x.device)
            # n == 1 with a past: the single query sees every key, no mask needed
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))

    def _attend_per_row(self, q, k, v, caches: list[KVCache], layer_idx: int) -> torch.Tensor:
        """One decode step for B requests with their own caches (different lengths): row i appends to and
        attends ``caches[i]``. The projections around it run batched, which is where a decode step spends its
        time; the per-row attention avoids padding and copying caches of different lengths."""
        if q.shape[2] != 1 or len(caches) != q.shape[0]:
            raise ValueError("per-request caches need one cache per row and a single new position")
        rows = []
        gqa = self.num_heads != self.num_kv_heads
        for i, cache in enumerate(caches):
            ki, vi = cache.append(layer_idx, k[i : i + 1], v[i : i + 1])
            rows.append(F.scaled_dot_product_attention(q[i : i + 1], ki, vi, enable_gqa=gqa))
        return torch.cat(rows, dim=0)
