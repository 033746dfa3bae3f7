"""Boolean attention masks (``True`` = may attend) and their additive-bias form.

Shared by the flow encoder (chunk size in tokens) and the flow estimator (chunk size in mel frames). Chunk masks
make streaming possible: a query never sees keys beyond the end of its own chunk, so earlier outputs do not change
when more input arrives.
"""

from __future__ import annotations

import torch


def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """lengths ``[B]`` -> ``[B, 1, max_len]``, True on valid (non-padded) frames."""
    positions = torch.arange(max_len, device=lengths.device)
    return (positions[None, :] < lengths[:, None]).unsqueeze(1)


def chunk_mask(
    size: int,
    chunk_size: int,
    num_left_chunks: int = -1,
    device: torch.device | None = None,
    query_start: int = 0,
) -> torch.Tensor:
    """``[size - query_start, size]``: query ``i`` may attend key ``j`` iff ``j < (i // chunk_size + 1) * chunk_size``.

    Rows are the queries ``query_start .. size-1`` (all of them by default; an incremental caller that has cached
    the keys of the first ``query_start`` positions only needs the rows of the new ones).
    ``num_left_chunks >= 0`` additionally limits the look-back to that many whole chunks before the query's own
    chunk; ``< 0`` keeps all left context. (The reference's ``subsequent_chunk_mask`` ignores its
    ``num_left_chunks`` argument; every released config uses -1, where both agree.)
    """
    pos = torch.arange(size, device=device)
    chunk_index = torch.div(pos[query_start:], chunk_size, rounding_mode="trunc")
    allowed = pos[None, :] < ((chunk_index + 1) * chunk_size)[:, None]
    if num_left_chunks >= 0:
        start = ((chunk_index - num_left_chunks).clamp(min=0) * chunk_size)[:, None]
        allowed = allowed & (pos[None, :] >= start)
    return allowed


def attention_mask(
    key_mask: torch.Tensor, chunk_size: int = 0, num_left_chunks: int = -1, query_start: int = 0
) -> torch.Tensor:
    """Combine a key padding mask ``[B, 1, T]`` with an optional chunk mask.

    Returns ``[B, 1, T]`` (key padding only) when ``chunk_size <= 0``, else ``[B, T - query_start, T]`` (the rows of
    queries ``query_start ..``, see ``chunk_mask``). Rows with no allowed key
    (only possible for an all-padding sequence) are opened fully, as the reference does, so that softmax stays
    finite; such rows are masked again downstream.
    """
    mask = key_mask
    if chunk_size > 0:
        size = key_mask.size(-1)
        mask = key_mask & chunk_mask(size, chunk_size, num_left_chunks, key_mask.device, query_start).unsqueeze(0)
    empty_rows = ~mask.any(dim=-1, keepdim=True)
    return mask | empty_rows


def mask_to_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask -> additive bias ``(1 - m) * -1e10`` in ``dtype`` (the reference's finite constant, not -inf)."""
    return (1.0 - mask.to(dtype)) * -1.0e10
