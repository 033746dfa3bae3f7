"""AudioVAE V2 decoder: latents at 25 Hz -> 48 kHz waveform, conditioned on the output sample-rate bucket."""

from __future__ import annotations

import torch
from torch import nn

from cadenza.layers.snake import Snake
from cadenza.models.voxcpm2.audio_vae_blocks import CausalDecoderBlock, SampleRateFiLM
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.audio_vae_conv import CausalConv1d, ConvStreamState

# Architecture constants of the reference (not config entries).
IO_KERNEL = 7


class AudioVAEDecoder(nn.Module):
    """Input convs, one :class:`CausalDecoderBlock` per rate (each after its sample-rate FiLM), snake, conv, tanh.

    ``model`` holds the layers under the release's indices: depthwise k7 conv + 1x1 conv (one k7 conv when not
    depthwise), the blocks, the final snake and k7 conv. ``sr_cond_model[i]`` is the FiLM in front of block ``i``.

    Shapes: ``z [B, latent_dim, T]``, ``bucket`` int64 ``[B]`` or ``[1]`` -> ``[B, 1, decode_hop_length * T]``.
    """

    def __init__(self, cfg: AudioVAEConfig) -> None:
        super().__init__()
        pad = IO_KERNEL - 1
        if cfg.depthwise:
            layers: list[nn.Module] = [
                CausalConv1d(cfg.latent_dim, cfg.latent_dim, IO_KERNEL, groups=cfg.latent_dim, left_pad=pad),
                CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 1, left_pad=0),
            ]
        else:
            layers = [CausalConv1d(cfg.latent_dim, cfg.decoder_dim, IO_KERNEL, left_pad=pad)]
        first_block = len(layers)
        for i, stride in enumerate(cfg.decoder_rates):
            # floor division per block, as the reference (decoder_dim 160: 160 -> 80 -> 40 -> 20 -> 10 -> 5 -> 2)
            layers.append(CausalDecoderBlock(cfg.decoder_channels(i), cfg.decoder_channels(i + 1), stride,
                                             cfg.depthwise))
        layers += [Snake(cfg.decoder_out_dim), CausalConv1d(cfg.decoder_out_dim, 1, IO_KERNEL, left_pad=pad)]
        self.model = nn.ModuleList(layers)

        if cfg.sr_bin_boundaries is None:
            self.sr_cond_model = None
            self.sr_bin_boundaries: torch.Tensor | None = None
        else:
            buckets = len(cfg.sr_bin_boundaries) + 1
            self.sr_cond_model = nn.ModuleDict({
                str(first_block + i): SampleRateFiLM(cfg.decoder_channels(i), buckets, cfg.cond_type, cfg.cond_dim,
                                                     cfg.cond_out_layer)
                for i in range(len(cfg.decoder_rates))
            })
            self.register_buffer("sr_bin_boundaries", torch.tensor(cfg.sr_bin_boundaries, dtype=torch.int32))

    def bucket(self, sample_rate: torch.Tensor) -> torch.Tensor | None:
        """Sample rates (int ``[B]``) -> FiLM bucket indices (``torch.bucketize``: 20000 -> 0, 48000 -> 3)."""
        if self.sr_bin_boundaries is None:
            return None
        return torch.bucketize(sample_rate.to(self.sr_bin_boundaries.dtype), self.sr_bin_boundaries)

    def forward(self, z: torch.Tensor, bucket: torch.Tensor | None,
                state: ConvStreamState | None = None) -> torch.Tensor:
        x = z
        for i, layer in enumerate(self.model):
            if self.sr_cond_model is not None and str(i) in self.sr_cond_model:
                x = self.sr_cond_model[str(i)](x, bucket)
            x = layer(x, state) if isinstance(layer, (CausalConv1d, CausalDecoderBlock)) else layer(x)
        return torch.tanh(x)
