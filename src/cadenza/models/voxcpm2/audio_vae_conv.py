"""Causal convolutions of the AudioVAE and the per-stream state that lets the decoder run chunk by chunk.

One-shot (``state=None``) both layers reproduce the reference exactly: the conv left-pads with zeros, the
transposed conv drops its trailing ``kernel - stride`` samples. With a :class:`ConvStreamState` every call
continues the previous one: the conv prepends the last ``left_pad`` input samples it saw (zeros at the start),
the transposed conv prepends its last ``(kernel - 1) // stride`` input frames and drops the outputs they already
produced. Decoding a latent sequence in any split therefore equals decoding it at once (up to float rounding).

Weights are plain (the release's weight norm is folded at load time).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvStreamState:
    """Left context of every causal (transposed) conv of one decoding stream, keyed by the layer.

    Owned by one request; the layers are shared and hold no per-request data.
    """

    def __init__(self) -> None:
        self._context: dict[nn.Module, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self._context)

    def clear(self) -> None:
        """Forget all context: the next chunk starts a new stream (zero history)."""
        self._context.clear()

    def extend(self, layer: nn.Module, x: torch.Tensor, context: int) -> torch.Tensor:
        """Return ``[stored context ‖ x]`` (zeros when nothing is stored) and store its last ``context`` frames.

        Args:
            layer: the layer whose context this is.
            x: ``[B, C, T]`` new input (any ``T >= 1``, also shorter than ``context``).
            context: frames of history the layer needs.

        Returns:
            ``[B, C, context + T]``.
        """
        prev = self._context.get(layer)
        if prev is None:
            prev = x.new_zeros(x.shape[0], x.shape[1], context)
        full = torch.cat([prev, x], dim=-1)
        self._context[layer] = full[..., -context:].detach()
        return full


class CausalConv1d(nn.Conv1d):
    """``Conv1d`` with ``left_pad`` zeros (or the stream's history) in front and no right padding.

    Args:
        left_pad: ``(kernel - 1) * dilation`` for stride 1, ``kernel - stride`` for the strided downsamplers
            (the reference's ``2 * padding - output_padding``).
        other args as ``nn.Conv1d`` (``padding`` is always 0).

    Shapes: ``[B, C_in, T] -> [B, C_out, (T + left_pad - dilation * (kernel - 1) - 1) // stride + 1]``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, left_pad: int, stride: int = 1,
                 dilation: int = 1, groups: int = 1, bias: bool = True) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, dilation=dilation, groups=groups,
                         bias=bias)
        if left_pad < 0:
            raise ValueError(f"left_pad must be >= 0, got {left_pad}")
        self.left_pad = left_pad

    def forward(self, x: torch.Tensor, state: ConvStreamState | None = None) -> torch.Tensor:
        if self.left_pad == 0:
            return super().forward(x)
        x = F.pad(x, (self.left_pad, 0)) if state is None else state.extend(self, x, self.left_pad)
        return super().forward(x)


class CausalConvTranspose1d(nn.ConvTranspose1d):
    """``ConvTranspose1d`` (no padding) whose trailing ``kernel - stride`` outputs are dropped: ``T -> stride * T``.

    The reference trims ``2 * ceil(stride / 2) - stride % 2``, which equals ``stride = kernel - stride`` for its
    ``kernel = 2 * stride``.

    Shapes: ``[B, C_in, T] -> [B, C_out, stride * T]``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        if kernel_size < stride:
            raise ValueError(f"kernel {kernel_size} must be >= stride {stride}")
        super().__init__(in_channels, out_channels, kernel_size, stride=stride)
        self.trim = kernel_size - stride
        # Input frames before the chunk that still reach the chunk's first output sample.
        self.context = (kernel_size - 1) // stride

    def forward(self, x: torch.Tensor, state: ConvStreamState | None = None) -> torch.Tensor:
        if state is None or self.context == 0:
            out = super().forward(x)
            return out[..., : out.shape[-1] - self.trim]
        full = state.extend(self, x, self.context)
        out = super().forward(full)
        # The context frames' own outputs were returned by the previous call; their tails reach into this chunk.
        left = self.context * self.stride[0]
        return out[..., left: out.shape[-1] - self.trim]
