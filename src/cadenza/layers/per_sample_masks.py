"""Attention masks that differ per batch row (training with a mix of mask types; docs/training.md, "Stage flow").

Each row gets its own chunk size: 0 = full attention (non-causal), 1 = full-causal, M = chunk-M (a query sees its
own chunk of M positions and everything before it). Built from the same ``chunk_mask`` rule as inference, so a
model trained on a chunk size sees exactly the mask it gets when streaming with that chunk.
"""

from __future__ import annotations

import torch

from cadenza.layers.masks import attention_mask


def per_sample_attention_mask(key_mask: torch.Tensor, chunk_sizes: torch.Tensor, num_left_chunks: int = -1) -> torch.Tensor:
    """key_mask bool ``[B, 1, T]`` (True = valid key), chunk_sizes int ``[B]`` -> bool ``[B, T, T]`` (True = attend).

    Row ``b`` equals ``attention_mask(key_mask[b:b+1], chunk_sizes[b], num_left_chunks)`` broadcast to ``[T, T]``.
    """
    if chunk_sizes.dim() != 1 or chunk_sizes.numel() != key_mask.size(0):
        raise ValueError(f"chunk_sizes must be [B={key_mask.size(0)}], got {tuple(chunk_sizes.shape)}")
    b, _, t = key_mask.shape
    out = torch.empty(b, t, t, dtype=torch.bool, device=key_mask.device)
    sizes = chunk_sizes.tolist()
    for size in sorted(set(sizes)):
        rows = torch.tensor([i for i, s in enumerate(sizes) if s == size], device=key_mask.device)
        out[rows] = attention_mask(key_mask[rows], int(size), num_left_chunks).expand(-1, t, t)
    return out
