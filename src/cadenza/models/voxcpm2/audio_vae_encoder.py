"""AudioVAE V2 encoder: 16 kHz waveform -> latent mean ``mu`` at 25 Hz (causal convs only)."""

from __future__ import annotations

import torch
from torch import nn

from cadenza.models.voxcpm2.audio_vae_blocks import CausalEncoderBlock
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.audio_vae_conv import CausalConv1d

# Architecture constants of the reference (not config entries).
INPUT_KERNEL = 7
LATENT_KERNEL = 3


class AudioVAEEncoder(nn.Module):
    """conv k7 ``1 -> encoder_dim``, one :class:`CausalEncoderBlock` per rate (channels double), ``fc_mu`` k3.

    ``fc_logvar`` exists in the release (and is loaded) but inference uses only the mean.

    Shapes: ``wav [B, 1, N]`` (N a multiple of ``hop_length``) -> ``mu [B, latent_dim, N / hop_length]``.
    """

    def __init__(self, cfg: AudioVAEConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv1d(1, cfg.encoder_dim, INPUT_KERNEL, left_pad=INPUT_KERNEL - 1)]
        channels = cfg.encoder_dim
        for stride in cfg.encoder_rates:
            layers.append(CausalEncoderBlock(channels, stride, cfg.depthwise))
            channels *= 2
        self.block = nn.ModuleList(layers)
        self.fc_mu = CausalConv1d(channels, cfg.latent_dim, LATENT_KERNEL, left_pad=LATENT_KERNEL - 1)
        self.fc_logvar = CausalConv1d(channels, cfg.latent_dim, LATENT_KERNEL, left_pad=LATENT_KERNEL - 1)

    def hidden(self, wav: torch.Tensor) -> torch.Tensor:
        """``[B, 1, N] -> [B, encoder_out_dim, N / hop_length]`` (the input of ``fc_mu`` / ``fc_logvar``)."""
        x = wav
        for layer in self.block:
            x = layer(x)
        return x

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """``[B, 1, N] -> mu [B, latent_dim, N / hop_length]``."""
        return self.fc_mu(self.hidden(wav))

    def mu_logvar(self, wav: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both heads, each ``[B, latent_dim, N / hop_length]`` (log-variance is for training tools only)."""
        h = self.hidden(wav)
        return self.fc_mu(h), self.fc_logvar(h)
