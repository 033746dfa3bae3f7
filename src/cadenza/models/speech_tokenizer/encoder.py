"""Building blocks of the speech tokenizer: the strided conv downsampler and a bidirectional rotary transformer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.layers.attention import GQASelfAttention
from cadenza.layers.rms_norm import RMSNorm
from cadenza.layers.rotary import RotaryEmbedding
from cadenza.layers.swiglu import SwiGLU
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig


def valid_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """``lengths [B]`` -> bool ``[B, max_len]``, True on the first ``lengths[b]`` positions."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


class ConvDownsampler(nn.Module):
    """Strided ``Conv1d`` + GELU stack: whisper log-mel ``[B, n_mels, T]`` -> ``[B, T // downsample, H]``.

    Each conv has padding ``kernel // 2``; the output of every stage is cut to ``floor(length / stride)`` frames.
    Because ``kernel // 2 < stride`` (checked by the config), the frames kept never see samples past the end of the
    input, so the ids of an utterance do not depend on the padding of a batch.
    """

    def __init__(self, cfg: SpeechTokenizerConfig) -> None:
        super().__init__()
        self.strides = cfg.conv_strides
        channels = [cfg.n_mels] + [cfg.hidden_size] * len(cfg.conv_strides)
        self.convs = nn.ModuleList(
            nn.Conv1d(channels[i], channels[i + 1], cfg.conv_kernel, stride=s, padding=cfg.conv_kernel // 2)
            for i, s in enumerate(cfg.conv_strides)
        )

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = mel
        length = mel.shape[-1]
        for conv, stride in zip(self.convs, self.strides):
            length //= stride
            x = F.gelu(conv(x))[..., :length]
        return x.transpose(1, 2)


class EncoderBlock(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + swiglu(norm(x))``. ``[B, T, H] -> [B, T, H]``."""

    def __init__(self, cfg: SpeechTokenizerConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = GQASelfAttention(cfg.hidden_size, cfg.num_heads, cfg.num_heads, cfg.head_dim,
                                     qkv_bias=True, out_bias=True)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.ffn = SwiGLU(cfg.hidden_size, cfg.ffn_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``key_mask``: bool ``[B, 1, 1, T]``, True on real frames (every query attends all real frames)."""
        x = x + self.attn(self.attn_norm(x), cos, sin, attn_mask=key_mask)
        return x + self.ffn(self.ffn_norm(x))


class TransformerEncoder(nn.Module):
    """``num_layers`` bidirectional :class:`EncoderBlock` s with rotary positions and a final RMSNorm."""

    def __init__(self, cfg: SpeechTokenizerConfig, num_layers: int) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x [B, T, H]``, ``mask`` bool ``[B, T]`` (True = real frame) -> ``[B, T, H]``."""
        positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        cos, sin = self.rotary(positions, x.dtype)
        key_mask = mask[:, None, None, :]
        for block in self.blocks:
            x = block(x, cos, sin, key_mask)
        return self.norm(x)
