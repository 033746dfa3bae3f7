"""Building blocks of the HiFT vocoder: the Snake residual block and the STFT pair."""

from __future__ import annotations

import torch
from torch import nn

from cadenza.layers.snake import Snake


def same_padding(kernel_size: int, dilation: int) -> int:
    """Padding that keeps the length of a stride-1 conv with an odd kernel."""
    return (kernel_size * dilation - dilation) // 2


class ResBlock(nn.Module):
    """HiFi-GAN / BigVGAN residual block with Snake activations.

    For each dilation d: ``x = x + conv2(snake2(conv1_d(snake1(x))))``; ``conv1_d`` is dilated by d, ``conv2`` is not.

    Args:
        channels: C.
        kernel_size: odd kernel of every conv.
        dilations: one (conv1, conv2) pair per dilation.

    Shapes: ``[B, C, T] -> [B, C, T]``.
    """

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=same_padding(kernel_size, d))
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=same_padding(kernel_size, 1)) for _ in dilations
        )
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv1, conv2, act1, act2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = conv2(act2(conv1(act1(x)))) + x
        return x


def periodic_hann(n_fft: int) -> torch.Tensor:
    """``[n_fft]`` float32 periodic Hann window (``scipy.signal.get_window('hann', n_fft, fftbins=True)``).

    Computed in float64 and rounded once, as the reference does with scipy.
    """
    # Explicitly on the CPU: the loader builds models on the meta device, and this buffer is not in the checkpoint.
    return torch.hann_window(n_fft, periodic=True, dtype=torch.float64, device="cpu").to(torch.float32)


def stft_real_imag(x: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor) -> torch.Tensor:
    """``x [B, L]`` -> ``[B, 2 * (n_fft // 2 + 1), L // hop + 1]``: real parts of all bins, then imaginary parts.

    Centered (reflect padding), window length = n_fft, not normalised.
    """
    spec = torch.view_as_real(torch.stft(x, n_fft, hop, n_fft, window=window, return_complex=True))
    return torch.cat([spec[..., 0], spec[..., 1]], dim=1)


def istft_mag_phase(magnitude: torch.Tensor, phase: torch.Tensor, n_fft: int, hop: int,
                    window: torch.Tensor) -> torch.Tensor:
    """``magnitude, phase [B, n_fft // 2 + 1, T]`` -> waveform ``[B, hop * (T - 1)]`` (centered iSTFT)."""
    spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
    return torch.istft(spec, n_fft, hop, n_fft, window=window)
