"""LocEnc: one latent patch -> one LM embedding (state prefix ``feat_encoder.``).

See docs/design.md, "VoxCPM 2 networks".

Each patch ``[P, D]`` is projected to the encoder width, a learned CLS token is prepended, and the ``P + 1`` tokens
run through a bidirectional MiniCPM-4 stack (RoPE positions 0..P). The CLS output summarises the patch. Patches
are processed independently (folded into the batch dimension).
"""

from __future__ import annotations

import torch
from torch import nn

from cadenza.models.voxcpm2.config import MiniCPM4Config
from cadenza.models.voxcpm2.minicpm4 import MiniCPMModel


class LocalEncoder(nn.Module):
    """``[B, T, P, D]`` latent patches -> ``[B, T, hidden]`` (LocEnc width; ``enc_to_lm_proj`` maps it to the LM)."""

    def __init__(self, cfg: MiniCPM4Config, input_dim: int) -> None:
        super().__init__()
        self.special_token = nn.Parameter(torch.randn(1, 1, 1, cfg.hidden_size))
        self.in_proj = nn.Linear(input_dim, cfg.hidden_size)
        self.encoder = MiniCPMModel(cfg)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        b, t, p, _ = patches.shape
        x = self.in_proj(patches)
        cls = self.special_token.expand(b, t, 1, -1)
        x = torch.cat([cls, x], dim=2).reshape(b * t, p + 1, -1)
        out = self.encoder(x, causal=False)
        return out[:, 0, :].reshape(b, t, -1)
