"""Building blocks of the AudioVAE V2: residual unit, encoder block, decoder block and the sample-rate FiLM.

Submodule names follow the release's ``audiovae.pth`` (``block.{i}``), so a folded checkpoint loads unchanged.
Every block takes an optional :class:`ConvStreamState` that its causal convs continue from (decoder streaming).
"""

from __future__ import annotations

import torch
from torch import nn

from cadenza.layers.embedding import Embedding
from cadenza.layers.snake import Snake
from cadenza.models.voxcpm2.audio_vae_conv import CausalConv1d, CausalConvTranspose1d, ConvStreamState

# Architecture constants of the reference (not config entries).
RESIDUAL_KERNEL = 7
RESIDUAL_DILATIONS = (1, 3, 9)


class CausalResidualUnit(nn.Module):
    """``x + conv1x1(snake(conv7_dilated(snake(x))))``.

    Args:
        channels: C.
        dilation: dilation of the k7 conv (left context ``6 * dilation``).
        groups: groups of the k7 conv (C = depthwise).

    Shapes: ``[B, C, T] -> [B, C, T]``.
    """

    def __init__(self, channels: int, dilation: int, groups: int) -> None:
        super().__init__()
        self.block = nn.ModuleList([
            Snake(channels),
            CausalConv1d(channels, channels, RESIDUAL_KERNEL, dilation=dilation, groups=groups,
                         left_pad=(RESIDUAL_KERNEL - 1) * dilation),
            Snake(channels),
            CausalConv1d(channels, channels, 1, left_pad=0),
        ])

    def forward(self, x: torch.Tensor, state: ConvStreamState | None = None) -> torch.Tensor:
        snake1, conv, snake2, proj = self.block
        y = proj(snake2(conv(snake1(x), state)))
        return x + y


def _residual_units(channels: int, depthwise: bool) -> list[nn.Module]:
    groups = channels if depthwise else 1
    return [CausalResidualUnit(channels, d, groups) for d in RESIDUAL_DILATIONS]


class CausalEncoderBlock(nn.Module):
    """Three residual units at ``C_in``, snake, strided conv ``C_in -> 2 C_in`` (kernel ``2 * stride``).

    Shapes: ``[B, C_in, T] -> [B, 2 C_in, T / stride]`` (T a multiple of ``stride``).
    """

    def __init__(self, in_channels: int, stride: int, depthwise: bool) -> None:
        super().__init__()
        self.block = nn.ModuleList([
            *_residual_units(in_channels, depthwise),
            Snake(in_channels),
            CausalConv1d(in_channels, 2 * in_channels, 2 * stride, stride=stride, left_pad=stride),
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *units, snake, down = self.block
        for unit in units:
            x = unit(x)
        return down(snake(x))


class CausalDecoderBlock(nn.Module):
    """Snake, transposed conv ``C_in -> C_in / 2`` (kernel ``2 * stride``), three residual units at ``C_in / 2``.

    Shapes: ``[B, C_in, T] -> [B, C_in / 2, stride * T]``.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, depthwise: bool) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.block = nn.ModuleList([
            Snake(in_channels),
            CausalConvTranspose1d(in_channels, out_channels, 2 * stride, stride),
            *_residual_units(out_channels, depthwise),
        ])

    def forward(self, x: torch.Tensor, state: ConvStreamState | None = None) -> torch.Tensor:
        snake, up, *units = self.block
        x = up(snake(x), state)
        for unit in units:
            x = unit(x, state)
        return x


class SampleRateFiLM(nn.Module):
    """Sample-rate conditioning in front of a decoder block, chosen by the output sample-rate bucket ``b``.

    ``cond_type`` (the reference's ``SampleRateConditionLayer``):

    * ``scale_bias`` / ``scale_bias_init`` (release): ``x * scale[b] + bias[b]`` (the two differ only in the
      reference's initialisation);
    * ``add``: ``x + cond[b]``;
    * ``concat``: ``[x ‖ cond[b]]`` (``cond_dim`` extra channels, repeated over time) — needs ``out_layer``.

    With ``out_layer`` the result then goes through snake + 1x1 conv back to ``C`` channels (``out_layer.0/1``).

    Args:
        channels: C.
        buckets: number of sample-rate buckets (``len(boundaries) + 1``).
        cond_type, cond_dim, out_layer: as in :class:`AudioVAEConfig`.

    Shapes: ``x [B, C, T]``, ``bucket`` int64 ``[B]`` or ``[1]`` -> ``[B, C, T]``.
    """

    def __init__(self, channels: int, buckets: int, cond_type: str = "scale_bias", cond_dim: int = 128,
                 out_layer: bool = False) -> None:
        super().__init__()
        self.cond_type = cond_type
        out_in = channels
        if cond_type in ("scale_bias", "scale_bias_init"):
            self.scale_embed = Embedding(buckets, channels)
            self.bias_embed = Embedding(buckets, channels)
            nn.init.ones_(self.scale_embed.weight)
            nn.init.zeros_(self.bias_embed.weight)
        elif cond_type == "add":
            self.cond_embed = Embedding(buckets, channels)
        elif cond_type == "concat":
            if not out_layer:  # the reference asserts this: the concatenation must be projected back
                raise ValueError("cond_type 'concat' needs cond_out_layer")
            self.cond_embed = Embedding(buckets, cond_dim)
            out_in = channels + cond_dim
        else:
            raise ValueError(f"unknown cond_type {cond_type!r}")
        self.out_layer = nn.ModuleList([Snake(out_in), CausalConv1d(out_in, channels, 1, left_pad=0)]) \
            if out_layer else None

    def forward(self, x: torch.Tensor, bucket: torch.Tensor) -> torch.Tensor:
        if self.cond_type == "add":
            x = x + self.cond_embed(bucket).unsqueeze(-1)
        elif self.cond_type == "concat":
            cond = self.cond_embed(bucket).unsqueeze(-1).expand(x.shape[0], -1, x.shape[-1])
            x = torch.cat([x, cond], dim=1)
        else:
            x = x * self.scale_embed(bucket).unsqueeze(-1) + self.bias_embed(bucket).unsqueeze(-1)
        if self.out_layer is not None:
            snake, conv = self.out_layer
            x = conv(snake(x))  # 1x1: no left context, so nothing to carry between stream chunks
        return x
