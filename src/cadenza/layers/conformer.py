"""The pre-norm conformer block of the CosyVoice 2 flow encoder (macaron FFN and convolution module off).

``x += MHA_rel(LN_mha(x)); x += FFN(LN_ff(x))`` with ESPnet's LayerNorm eps of 1e-12 and a SiLU feed-forward.
With the convolution module off this is a plain pre-norm transformer layer with relative positions; the
submodule names (``norm_mha``, ``self_attn``, ``norm_ff``, ``feed_forward.w_1/w_2``) are the checkpoint's.
"""

from __future__ import annotations

import torch
from torch import nn

from cadenza.layers.relpos_attention import RelPositionMultiHeadedAttention
from cadenza.layers.stream_cache import StreamCache

ESPNET_LAYER_NORM_EPS = 1e-12


class PositionwiseFeedForward(nn.Module):
    """``Linear(d, hidden) -> SiLU -> Linear(hidden, d)`` on ``[..., d]``."""

    def __init__(self, d_model: int, hidden_units: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, hidden_units)
        self.activation = nn.SiLU()
        self.w_2 = nn.Linear(hidden_units, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.activation(self.w_1(x)))


class ConformerBlock(nn.Module):
    """``[B, T, d] -> [B, T, d]``: rel-pos self-attention then feed-forward, each pre-normed with a residual."""

    def __init__(self, d_model: int, n_head: int, hidden_units: int) -> None:
        super().__init__()
        self.self_attn = RelPositionMultiHeadedAttention(n_head, d_model)
        self.feed_forward = PositionwiseFeedForward(d_model, hidden_units)
        self.norm_ff = nn.LayerNorm(d_model, eps=ESPNET_LAYER_NORM_EPS)
        self.norm_mha = nn.LayerNorm(d_model, eps=ESPNET_LAYER_NORM_EPS)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, pos_emb: torch.Tensor, cache: StreamCache | None = None
    ) -> torch.Tensor:
        """x ``[B, T, d]``, mask bool ``[B, 1, T]`` / ``[B, T, T]`` (True = attend), pos_emb ``[1, 2T-1, d]``.

        With ``cache`` (incremental inference) x are the ``T`` positions after the cached ones; mask and pos_emb
        then cover cached + new keys (see ``RelPositionMultiHeadedAttention.forward``).
        """
        x = x + self.self_attn(self.norm_mha(x), mask, pos_emb, cache)
        return x + self.feed_forward(self.norm_ff(x))
