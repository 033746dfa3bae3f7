"""Layers of the CAM++-style speaker encoder: the 2-D front end (FCM), densely connected TDNN layers with
context-aware masking (CAM), transitions and statistics pooling."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def bn_relu(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.BatchNorm1d(channels), nn.ReLU())


class ResBlock2d(nn.Module):
    """2-D residual block; ``stride`` applies to the frequency axis only. ``[B, C_in, F, T] -> [B, C, F', T]``."""

    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride=(stride, 1), bias=False),
                                          nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class FrontEnd2d(nn.Module):
    """CAM++'s FCM: conv, residual stages (each halving frequency), a final frequency-halving conv; the channels and
    remaining bins are flattened. ``[B, n_mels, T] -> [B, channels * out_bins, T]``."""

    def __init__(self, channels: int, blocks: tuple[int, ...]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.stages = nn.ModuleList(
            nn.Sequential(*(ResBlock2d(channels, channels, 2 if i == 0 else 1) for i in range(n))) for n in blocks
        )
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        for stage in self.stages:
            x = stage(x)
        x = F.relu(self.bn2(self.conv2(x)))
        return x.flatten(1, 2)


class ContextAwareMask(nn.Module):
    """CAM layer: a local TDNN conv whose output is gated by a mask from utterance- and segment-level context.

    ``y = conv(x) * sigmoid(W2 relu(W1 (mean_t(x) + segment_mean(x))))``. ``[B, C_in, T] -> [B, C_out, T]``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel: int, dilation: int, reduction: int,
                 segment: int) -> None:
        super().__init__()
        self.segment = segment
        self.local = nn.Conv1d(in_channels, out_channels, kernel, padding=(kernel - 1) // 2 * dilation,
                               dilation=dilation, bias=False)
        self.context1 = nn.Conv1d(in_channels, in_channels // reduction, 1)
        self.context2 = nn.Conv1d(in_channels // reduction, out_channels, 1)

    def segment_pool(self, x: torch.Tensor) -> torch.Tensor:
        """Mean over consecutive ``segment``-frame windows, repeated back to every frame (the last window may be
        shorter and averages only its real frames)."""
        pooled = F.avg_pool1d(x, self.segment, self.segment, ceil_mode=True)  # [B, C, ceil(T / segment)]
        return pooled.repeat_interleave(self.segment, dim=-1)[..., : x.shape[-1]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = x.mean(-1, keepdim=True) + self.segment_pool(x)
        mask = torch.sigmoid(self.context2(F.relu(self.context1(context))))
        return self.local(x) * mask


class DenseTDNNLayer(nn.Module):
    """BN-ReLU, 1x1 bottleneck, BN-ReLU, CAM layer; returns only the ``growth`` new channels."""

    def __init__(self, in_channels: int, growth: int, bottleneck: int, kernel: int, dilation: int,
                 reduction: int, segment: int) -> None:
        super().__init__()
        self.norm1 = bn_relu(in_channels)
        self.bottleneck = nn.Conv1d(in_channels, bottleneck, 1, bias=False)
        self.norm2 = bn_relu(bottleneck)
        self.cam = ContextAwareMask(bottleneck, growth, kernel, dilation, reduction, segment)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cam(self.norm2(self.bottleneck(self.norm1(x))))


class DenseTDNNBlock(nn.Module):
    """Densely connected layers: each one's output is concatenated to its input.
    ``[B, C, T] -> [B, C + layers * growth, T]``."""

    def __init__(self, layers: int, in_channels: int, growth: int, bottleneck: int, kernel: int, dilation: int,
                 reduction: int, segment: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DenseTDNNLayer(in_channels + i * growth, growth, bottleneck, kernel, dilation, reduction, segment)
            for i in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.cat([x, layer(x)], dim=1)
        return x


class Transition(nn.Module):
    """BN-ReLU then a 1x1 conv (CAM++ halves the channels here). ``[B, C_in, T] -> [B, C_out, T]``."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.norm = bn_relu(in_channels)
        self.proj = nn.Conv1d(in_channels, out_channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def stats_pool(x: torch.Tensor) -> torch.Tensor:
    """``[B, C, T]`` -> ``[B, 2C]``: mean and (unbiased) standard deviation over time (T >= 2)."""
    return torch.cat([x.mean(-1), x.std(-1, unbiased=True)], dim=-1)
