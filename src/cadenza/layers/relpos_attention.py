"""Multi-head self-attention with relative positional scores (Transformer-XL / ESPnet "rel_selfattn").

``scores = ((q + u) k^T + rel_shift((q + v) p^T)) / sqrt(d_k)`` with learned per-head biases ``u`` (``pos_bias_u``)
and ``v`` (``pos_bias_v``) and ``p = linear_pos(pos_emb)``. Masked scores are ``-inf`` and a fully masked row gives
zeros, not NaN, as in the reference. The position term is passed to fused SDPA as an additive bias.

The projection (``project_qkv``) and the attention proper (``attend``) are separate so that a caller can
concatenate cached keys/values in between. With a ``StreamCache`` (incremental inference) the layer does that
itself: new queries attend over the cached keys of earlier positions plus the new ones, and the projected
position rows (``linear_pos`` of each relative position, fixed once the weights are) are kept too, so a call costs
O(new x all) instead of re-projecting the whole table.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.layers.stream_cache import StreamCache


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, T1, T2 + T1 - 1] -> [B, H, T1, T2]`` with ``out[..., i, j] = x[..., i, T1 - 1 - i + j]``.

    The columns of ``x`` are relative positions ``+(T2-1) .. -(T1-1)`` (ESPnet's table order, key to the left of
    the query = positive) and the ``T1`` queries are the last ones of the ``T2`` keys, so column
    ``T1 - 1 - i + j`` holds relative position ``i' - j`` (``i' = T2 - T1 + i``, the query's key index). With
    ``T1 == T2`` this is ESPnet's square case; ``T1 < T2`` serves new queries against cached keys.
    """
    b, h, t1, width = x.shape
    padded = torch.cat([x.new_zeros(b, h, t1, 1), x], dim=-1).view(b, h, width + 1, t1)
    return padded[:, :, 1:].view_as(x)[:, :, :, : width - t1 + 1]


class RelPositionMultiHeadedAttention(nn.Module):
    """Self-attention over ``[B, T, n_feat]`` with ``n_head`` heads of ``n_feat / n_head`` channels."""

    def __init__(self, n_head: int, n_feat: int, key_bias: bool = True) -> None:
        super().__init__()
        if n_feat % n_head:
            raise ValueError(f"n_feat {n_feat} is not divisible by n_head {n_head}")
        self.h = n_head
        self.d_k = n_feat // n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat, bias=key_bias)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.empty(n_head, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.empty(n_head, self.d_k))
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, n_feat] -> [B, H, T, d_k]``."""
        return x.view(x.size(0), -1, self.h, self.d_k).transpose(1, 2)

    def project_qkv(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[B, T, n_feat]`` inputs -> q, k, v each ``[B, H, T, d_k]``."""
        return self._heads(self.linear_q(query)), self._heads(self.linear_k(key)), self._heads(self.linear_v(value))

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pos_emb: torch.Tensor | None,
        mask: torch.Tensor | None,
        projected_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of projected queries over explicit keys/values (which may include cached ones).

        q ``[B, H, T1, d_k]``; k, v ``[B, H, T2, d_k]`` (the queries are the last ``T1`` of the ``T2`` positions);
        pos_emb ``[1, T2 + T1 - 1, n_feat]`` (relative positions ``+(T2-1) .. -(T1-1)``), or ``projected_pos`` =
        ``linear_pos(pos_emb)`` already computed; mask bool ``[B, 1, T2]`` or ``[B, T1, T2]`` (True = attend) or
        None. Returns ``[B, T1, n_feat]``.
        """
        if projected_pos is None:
            projected_pos = self.linear_pos(pos_emb)
        p = self._heads(projected_pos)  # [1, H, T2+T1-1, d_k]
        q = q.transpose(1, 2)  # [B, T1, H, d_k]: the biases broadcast over (B, T1)
        q_u = (q + self.pos_bias_u).transpose(1, 2)
        q_v = ((q + self.pos_bias_v) * (1.0 / math.sqrt(self.d_k))).transpose(1, 2)
        # The position term enters the fused attention as an additive bias: SDPA computes q_u k^T / sqrt(d_k) + bias,
        # the softmax and the product with v in one kernel instead of materialising both score matrices.
        bias = torch.matmul(q_v, p.transpose(-2, -1))
        if bias.size(-1) != k.size(2):  # equal only for T1 == 1, where the shift is the identity
            bias = rel_shift(bias)  # a view of a fresh tensor: filled in place below
        empty = None
        if mask is not None:
            blocked = mask.unsqueeze(1).eq(0)[:, :, :, : k.size(2)]  # [B, 1, T1 or 1, T2]
            bias.masked_fill_(blocked, -float("inf"))
            empty = blocked.all(dim=-1, keepdim=True)  # a fully masked query row gives zeros (reference), not NaN
            if bool(empty.any()):
                bias.masked_fill_(empty, 0.0)
            else:
                empty = None
        x = F.scaled_dot_product_attention(q_u, k, v, attn_mask=bias)  # [B, H, T1, d_k]
        if empty is not None:
            x = x.masked_fill(empty, 0.0)
        x = x.transpose(1, 2).contiguous().view(x.size(0), -1, self.h * self.d_k)
        return self.linear_out(x)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, pos_emb: torch.Tensor, cache: StreamCache | None = None
    ) -> torch.Tensor:
        """Self-attention: x ``[B, T, n_feat]`` -> ``[B, T, n_feat]`` (mask / pos_emb as in ``attend``).

        With ``cache`` the ``T`` positions follow the cached ones: keys are cached + new, mask and pos_emb cover
        them all (``[B, T, past + T]``, ``[1, past + 2T - 1, n_feat]``); the first ``cache.commit`` new keys stay.
        """
        q, k, v = self.project_qkv(x, x, x)
        if cache is None:
            return self.attend(q, k, v, pos_emb, mask)
        kv = cache.kv(self)
        past = kv.length
        k, v = kv.append(0, k, v)
        out = self.attend(q, k, v, None, mask, self._cached_positions(pos_emb, cache, k.size(2), x.size(1)))
        kv.crop(past + cache.commit)
        return out

    def _cached_positions(self, pos_emb: torch.Tensor, cache: StreamCache, n_keys: int, n_queries: int):
        """``linear_pos`` of the rows of ``pos_emb`` (relative positions ``+(n_keys-1) .. -(n_queries-1)``), reusing
        and extending the rows this stream has projected before."""
        most_left, most_right = n_keys - 1, n_queries - 1
        state = cache.get((self, "pos"))
        if state is None:
            table, left, right = self.linear_pos(pos_emb), most_left, most_right
        else:
            table, left, right = state
            parts = [table]
            if most_left > left:  # rows of the new, larger positive positions come first
                parts.insert(0, self.linear_pos(pos_emb[:, : most_left - left]))
            if most_right > right:
                parts.append(self.linear_pos(pos_emb[:, pos_emb.size(1) - (most_right - right) :]))
            if len(parts) > 1:
                table, left, right = torch.cat(parts, dim=1), max(left, most_left), max(right, most_right)
        cache.set((self, "pos"), (table, left, right))
        return table[:, left - most_left : left + most_right + 1]

    def extra_repr(self) -> str:
        return f"heads={self.h}, d_k={self.d_k}"
