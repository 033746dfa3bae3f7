"""LocDiT: the velocity estimator of the patch-level flow matching (prefix ``feat_decoder.estimator.``).

See docs/design.md, "VoxCPM 2 networks".

Sequence fed to a bidirectional MiniCPM-4 stack (RoPE positions 0..2+2P):
``[mu_0, mu_1, time, cond_1..cond_P, x_1..x_P]`` where ``mu_0``/``mu_1`` are the TSLM / RALM condition tokens,
``time = time_mlp(S(t)) + delta_time_mlp(S(dt))``, ``cond`` the previous patch and ``x`` the noisy patch.
The outputs at the last P positions, projected back to the latent dim, are the velocity.
"""

from __future__ import annotations

import torch
from torch import nn

from cadenza.layers.timestep_embedding import SinusoidalTimeEmbedding, TimestepMLP
from cadenza.models.voxcpm2.config import MiniCPM4Config
from cadenza.models.voxcpm2.minicpm4 import MiniCPMModel


class LocalDiT(nn.Module):
    """Estimator ``v(x, mu, t, cond, dt)``; latent dim ``in_channels`` (D), width ``cfg.hidden_size`` (Hd)."""

    def __init__(self, cfg: MiniCPM4Config, in_channels: int) -> None:
        super().__init__()
        hidden = cfg.hidden_size
        self.in_channels = in_channels
        self.in_proj = nn.Linear(in_channels, hidden)
        self.cond_proj = nn.Linear(in_channels, hidden)
        self.out_proj = nn.Linear(hidden, in_channels)
        self.time_embeddings = SinusoidalTimeEmbedding(hidden)
        self.time_mlp = TimestepMLP(hidden, hidden)
        self.delta_time_mlp = TimestepMLP(hidden, hidden)
        self.decoder = MiniCPMModel(cfg)

    def forward(
        self, x: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, dt: torch.Tensor
    ) -> torch.Tensor:
        """x ``[N, D, P]`` noisy patch, mu ``[N, k·Hd]`` (k condition tokens, 2 in VoxCPM 2), t ``[N]``,
        cond ``[N, D, P']`` prefix patch, dt ``[N]`` (0 unless mean mode) -> velocity ``[N, D, P]``."""
        # contiguous() as in the reference: bf16 CPU matmuls round differently on transposed (strided) inputs
        xs = self.in_proj(x.transpose(1, 2).contiguous())
        cs = self.cond_proj(cond.transpose(1, 2).contiguous())
        temb = self.time_mlp(self.time_embeddings(t).to(xs.dtype))
        temb = temb + self.delta_time_mlp(self.time_embeddings(dt).to(xs.dtype))
        mu_tokens = mu.view(xs.size(0), -1, xs.size(-1))
        seq = torch.cat([mu_tokens, temb.unsqueeze(1), cs, xs], dim=1)
        hidden = self.decoder(seq, causal=False)
        hidden = hidden[:, mu_tokens.size(1) + 1 + cs.size(1):, :]
        return self.out_proj(hidden).transpose(1, 2)
