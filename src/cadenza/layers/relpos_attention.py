"""Multi-head self-attention with relative positional scores (Transformer-XL / ESPnet "rel_selfattn").

``scores = ((q + u) k^T + rel_shift((q + v) p^T)) / sqrt(d_k)`` with learned per-head biases ``u`` (``pos_bias_u``)
and ``v`` (``pos_bias_v``) and ``p = linear_pos(pos_emb)``. Masked scores are set to ``-inf`` before the softmax and
the probabilities to 0 after it (so a fully masked row gives zeros, not NaN), as in the reference.

The projection (``project_qkv``) and the attention proper (``attend``) are separate so that a caller can
concatenate cached keys/values in between.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, T1, 2*T1-1] -> [B, H, T1, T1]`` with ``out[..., i, j] = x[..., i, T1 - 1 - i + j]``.

    Column ``T1 - 1 - i + j`` of the position scores holds relative position ``i - j`` (ESPnet's table order).
    """
    b, h, t1, t2 = x.shape
    padded = torch.cat([x.new_zeros(b, h, t1, 1), x], dim=-1).view(b, h, t2 + 1, t1)
    return padded[:, :, 1:].view_as(x)[:, :, :, : t2 // 2 + 1]


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
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos_emb: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Attention of projected queries over explicit keys/values (which may include cached ones).

        q ``[B, H, T1, d_k]``; k, v ``[B, H, T2, d_k]``; pos_emb ``[1, 2*T1-1, n_feat]``; mask bool ``[B, 1, T2]``
        or ``[B, T1, T2]`` (True = attend) or None. Returns ``[B, T1, n_feat]``.
        """
        p = self._heads(self.linear_pos(pos_emb))  # [1, H, 2*T1-1, d_k]
        q = q.transpose(1, 2)  # [B, T1, H, d_k]: the biases broadcast over (B, T1)
        q_u = (q + self.pos_bias_u).transpose(1, 2)
        q_v = (q + self.pos_bias_v).transpose(1, 2)
        matrix_ac = torch.matmul(q_u, k.transpose(-2, -1))
        matrix_bd = torch.matmul(q_v, p.transpose(-2, -1))
        if matrix_ac.shape != matrix_bd.shape:
            matrix_bd = rel_shift(matrix_bd)
        scores = (matrix_ac + matrix_bd) / math.sqrt(self.d_k)
        if mask is not None:
            blocked = mask.unsqueeze(1).eq(0)[:, :, :, : scores.size(-1)]  # [B, 1, T1 or 1, T2]
            scores = scores.masked_fill(blocked, -float("inf"))
            attn = torch.softmax(scores, dim=-1).masked_fill(blocked, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)
        x = torch.matmul(attn, v)  # [B, H, T1, d_k]
        x = x.transpose(1, 2).contiguous().view(x.size(0), -1, self.h * self.d_k)
        return self.linear_out(x)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, pos_emb: torch.Tensor) -> torch.Tensor:
        """Self-attention: x ``[B, T, n_feat]`` -> ``[B, T, n_feat]`` (mask / pos_emb as in ``attend``)."""
        q, k, v = self.project_qkv(x, x, x)
        return self.attend(q, k, v, pos_emb, mask)

    def extra_repr(self) -> str:
        return f"heads={self.h}, d_k={self.d_k}"
