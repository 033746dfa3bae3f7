"""F0 predictor of the HiFT vocoder (reference ``ConvRNNF0Predictor``): mel -> f0 in Hz."""

from __future__ import annotations

import torch
from torch import nn

from cadenza.models.cosyvoice2.config import HiFTConfig

NUM_CONV_LAYERS = 5


class ConvRNNF0Predictor(nn.Module):
    """Five ``Conv1d(k=3, pad=1)`` + ELU layers, a per-frame ``Linear`` and ``abs``.

    ``condnet`` is an ``nn.Sequential`` of conv, ELU, conv, ELU, ... so the convs sit at indices 0, 2, 4, 6, 8,
    as in the released checkpoint. Despite the reference's name there is no RNN.
    """

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(NUM_CONV_LAYERS):
            in_ch = cfg.in_channels if i == 0 else cfg.f0_cond_channels
            layers += [nn.Conv1d(in_ch, cfg.f0_cond_channels, kernel_size=3, padding=1), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cfg.f0_cond_channels, cfg.f0_num_class)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """``mel [B, n_mels, F]`` -> ``f0 [B, F]`` (Hz, >= 0; with ``f0_num_class > 1``: ``[B, F, num_class]``)."""
        x = self.condnet(mel).transpose(1, 2)
        return torch.abs(self.classifier(x).squeeze(-1))
