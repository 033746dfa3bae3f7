"""The output phases of HiFT's transposed convolutions, and how to keep them from buzzing at the input frame rate.

A ``ConvTranspose1d`` with stride ``s`` computes output sample ``s t + p`` from its own subset of the kernel's taps,
one subset per phase ``p``: it is ``s`` ordinary convolutions interleaved. If the phases' taps sum to different
gains, a smooth input comes out modulated by a pattern that repeats every ``s`` output samples, that is once per
input frame: the checkerboard artifact of transposed convolutions (Odena et al. 2016; Pons et al., "Upsampling
artifacts in neural audio synthesis", 2021). In HiFT the first upsampler turns 50 Hz mel frames into 400 Hz
features (stride 8), so such a mismatch is a 20 ms buzz at 50, 100, 150 ... Hz.

cadenza-tiny's vocoder had learnt to voice with exactly that (docs/cadenza-tiny.md, "Quality"): the gains of its
first upsampler's phases spread 2.25x their mean (root mean square over channel pairs), and equalising them in the
trained weights takes the share of its whitened 1-7 kHz output that repeats every 20 ms from 0.58 to 0.03 (copy
synthesis of 8 teacher sentences) — and most of its intelligibility with it, since that buzz was how it voiced.

Two ways to train without it (``hift.even_upsample_gain``, ``hift.loss.upsample_gain_weight``):

* :class:`EqualPhaseGain`, a parametrization that projects the weight onto equal phase gains on every forward (the
  correction is spread evenly over each phase's taps); the projection is linear, so the gradient is projected too,
  it runs in the forward of any copy (the averaged generator's included), and the exported weight is exactly
  balanced (cadenza-tiny's vocoder, so trained, learnt to voice from its source: shipped 2026-12-06);
* :func:`phase_gain_imbalance`, a penalty that lets the decoder move there gradually.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize


def phase_taps(kernel_size: int, stride: int, padding: int) -> list[list[int]]:
    """For each output phase ``p`` (output index mod ``stride``), the kernel taps that produce it.

    ``ConvTranspose1d`` writes input ``i`` times tap ``j`` to output ``i * stride + j - padding``.
    """
    taps: list[list[int]] = [[] for _ in range(stride)]
    for j in range(kernel_size):
        taps[(j - padding) % stride].append(j)
    return taps


def phase_membership(kernel_size: int, stride: int, padding: int) -> torch.Tensor:
    """``[stride, kernel_size]``: 1 where a tap writes that output phase (``phase_taps`` as a matrix)."""
    membership = torch.zeros(stride, kernel_size)
    for p, idx in enumerate(phase_taps(kernel_size, stride, padding)):
        membership[p, idx] = 1.0
    return membership


def phase_gains(weight: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    """``weight [in, out, k]`` (a ``ConvTranspose1d``'s) -> ``[in, out, stride]``: each phase's summed taps, i.e. its
    gain for a constant input."""
    return weight @ phase_membership(weight.shape[-1], stride, padding).to(weight).T


def phase_gain_imbalance(conv: nn.ConvTranspose1d) -> torch.Tensor:
    """A scalar in [0, 1]: the energy of the phase gains' departure from their per-channel-pair mean over their whole
    energy (0: every phase has the same gain; ~1 - 1/stride for random weights)."""
    gains = phase_gains(conv.weight, conv.stride[0], conv.padding[0])
    spread = gains - gains.mean(-1, keepdim=True)
    return spread.pow(2).sum() / gains.pow(2).sum().clamp_min(1e-12)


class EqualPhaseGain(nn.Module):
    """Parametrization of a ``ConvTranspose1d`` weight ``[in, out, k]``: every output phase gets the same gain, the
    difference spread evenly over that phase's taps (the orthogonal projection onto balanced weights)."""

    def __init__(self, kernel_size: int, stride: int, padding: int) -> None:
        super().__init__()
        membership = phase_membership(kernel_size, stride, padding)
        taps = membership.sum(-1)  # [stride]
        if not bool((taps > 0).all()):
            raise ValueError(f"a stride-{stride} transposed convolution with {kernel_size} taps leaves a phase empty")
        # gains = w @ membership.T; the common gain that moves the weight least is the phases' mean weighted by
        # 1 / taps (a stride that does not divide the kernel leaves some phases a tap more), and each phase's excess
        # over it is taken back evenly from its taps: correction = excess @ (membership / taps). Not saved: the
        # module's state-dict names stay the weight norm's.
        self.register_buffer("membership", membership, persistent=False)
        self.register_buffer("target_weights", (1.0 / taps) / (1.0 / taps).sum(), persistent=False)
        self.register_buffer("spread", membership / taps[:, None], persistent=False)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        gains = weight @ self.membership.T  # [in, out, stride]
        excess = gains - (gains @ self.target_weights)[..., None]
        return weight - excess @ self.spread


def even_upsample_gain(conv: nn.ConvTranspose1d) -> None:
    """Register :class:`EqualPhaseGain` on ``conv.weight`` (after any weight-norm parametrization, whose state-dict
    names stay as they are: a checkpoint of the same run without it loads, and so does one with it)."""
    parametrize.register_parametrization(
        conv, "weight", EqualPhaseGain(conv.kernel_size[0], conv.stride[0], conv.padding[0]))

