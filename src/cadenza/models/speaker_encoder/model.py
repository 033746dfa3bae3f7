"""CAM++-style x-vector model: mean-normalised Kaldi fbank ``[B, T, 80]`` -> speaker embedding ``[B, 192]``.

FCM front end -> strided TDNN -> dense TDNN blocks with context-aware masking, each followed by a channel-halving
transition -> BN-ReLU -> mean + std pooling -> 1x1 projection + BatchNorm without affine parameters. Compare
embeddings by cosine similarity (their norm carries no meaning).
"""

from __future__ import annotations

import torch
from torch import nn

from cadenza.errors import InputError
from cadenza.models.speaker_encoder.blocks import DenseTDNNBlock, FrontEnd2d, Transition, bn_relu, stats_pool
from cadenza.models.speaker_encoder.config import SpeakerEncoderConfig


class SpeakerEncoderModel(nn.Module):
    """Args: cfg: every size. Shapes: ``fbank [B, T, n_mels] -> [B, embedding_size]`` (T >= 4 frames)."""

    def __init__(self, cfg: SpeakerEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.front = FrontEnd2d(cfg.fcm_channels, cfg.fcm_blocks)
        in_channels = cfg.fcm_channels * cfg.fcm_out_bins
        self.tdnn = nn.Conv1d(in_channels, cfg.tdnn_channels, cfg.tdnn_kernel, stride=cfg.tdnn_stride,
                              padding=(cfg.tdnn_kernel - 1) // 2, bias=False)
        self.tdnn_norm = bn_relu(cfg.tdnn_channels)
        channels = cfg.tdnn_channels
        self.blocks = nn.ModuleList()
        self.transitions = nn.ModuleList()
        for layers, kernel, dilation in zip(cfg.block_layers, cfg.block_kernels, cfg.block_dilations):
            self.blocks.append(DenseTDNNBlock(layers, channels, cfg.growth_rate, cfg.bottleneck_scale * cfg.growth_rate,
                                              kernel, dilation, cfg.cam_reduction, cfg.cam_segment_frames))
            channels += layers * cfg.growth_rate
            self.transitions.append(Transition(channels, channels // 2))
            channels //= 2
        self.out_norm = bn_relu(channels)
        self.embed = nn.Linear(2 * channels, cfg.embedding_size, bias=False)
        self.embed_norm = nn.BatchNorm1d(cfg.embedding_size, affine=False)

    @property
    def min_frames(self) -> int:
        """Fewest input frames that leave two frames for the standard deviation after the TDNN stride."""
        return 2 * self.cfg.tdnn_stride

    def forward(self, fbank: torch.Tensor) -> torch.Tensor:
        if fbank.dim() != 3 or fbank.shape[-1] != self.cfg.n_mels:
            raise InputError(f"fbank must be [batch, frames, {self.cfg.n_mels}], got {tuple(fbank.shape)}")
        if fbank.shape[1] < self.min_frames:
            raise InputError(f"fbank has {fbank.shape[1]} frames; the speaker encoder needs at least "
                             f"{self.min_frames} ({self.min_frames * 10} ms)")
        x = self.front(fbank.transpose(1, 2))
        x = self.tdnn_norm(self.tdnn(x))
        for block, transition in zip(self.blocks, self.transitions):
            x = transition(block(x))
        x = stats_pool(self.out_norm(x))
        return self.embed_norm(self.embed(x))
