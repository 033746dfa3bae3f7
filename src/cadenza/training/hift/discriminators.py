"""HiFT GAN discriminators: HiFi-GAN multi-period + multi-resolution STFT-magnitude discriminators.

See docs/training_components.md, "3. HiFT vocoder GAN".

Every conv is weight-normalised (``torch.nn.utils.parametrizations.weight_norm``) as in the reference.
:class:`HiFTDiscriminator` scores real and generated audio in one forward call (one DDP forward per step), running
both through each sub-discriminator as a single batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from cadenza.training.hift.config import DiscriminatorConfig

# Added under the square root of the STFT power: |X| has an infinite gradient at 0 (the reference's clamp, 1e-7).
MAGNITUDE_FLOOR = 1e-7

Scores = list[torch.Tensor]  # one [B, n] logit tensor per sub-discriminator
FeatureMaps = list[list[torch.Tensor]]  # per sub-discriminator, its activations after every conv


class PeriodDiscriminator(nn.Module):
    """Folds ``[B, L]`` into ``[B, 1, L / p, p]`` (reflect-padding L to a multiple of p) and applies 2-D convs along the
    folded time axis. Returns logits ``[B, n]`` and the feature maps."""

    def __init__(self, period: int, cfg: DiscriminatorConfig) -> None:
        super().__init__()
        self.period = period
        self.slope = cfg.lrelu_slope
        k, s, pad = cfg.period_kernel, cfg.period_stride, cfg.period_kernel // 2
        widths = (1, *cfg.period_channels)
        self.convs = nn.ModuleList(
            weight_norm(nn.Conv2d(widths[i], widths[i + 1], (k, 1), (s if i < len(widths) - 2 else 1, 1), (pad, 0)))
            for i in range(len(widths) - 1)
        )
        self.conv_post = weight_norm(nn.Conv2d(widths[-1], 1, (3, 1), 1, (1, 0)))

    def forward(self, wav: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        b, length = wav.shape
        if length % self.period:
            wav = F.pad(wav[:, None], (0, self.period - length % self.period), mode="reflect")[:, 0]
        x = wav.view(b, 1, -1, self.period)
        fmap = []
        for conv in self.convs:
            x = F.leaky_relu(conv(x), self.slope)
            fmap.append(x)
        x = self.conv_post(x)
        fmap.append(x)
        return x.flatten(1), fmap


class SpecDiscriminator(nn.Module):
    """2-D convs over an STFT magnitude ``[B, 1, frames, bins]`` (Hann window of ``win`` samples, centred)."""

    def __init__(self, n_fft: int, hop: int, win: int, cfg: DiscriminatorConfig) -> None:
        super().__init__()
        self.n_fft, self.hop, self.win = n_fft, hop, win
        self.slope = cfg.lrelu_slope
        c = cfg.spec_channels
        self.convs = nn.ModuleList([
            weight_norm(nn.Conv2d(1, c, (3, 9), padding=(1, 4))),
            weight_norm(nn.Conv2d(c, c, (3, 9), stride=(1, 2), padding=(1, 4))),
            weight_norm(nn.Conv2d(c, c, (3, 9), stride=(1, 2), padding=(1, 4))),
            weight_norm(nn.Conv2d(c, c, (3, 9), stride=(1, 2), padding=(1, 4))),
            weight_norm(nn.Conv2d(c, c, (3, 3), padding=(1, 1))),
        ])
        self.conv_post = weight_norm(nn.Conv2d(c, 1, 3, padding=1))
        self.register_buffer("window", torch.hann_window(win), persistent=False)
        self.memory_format = torch.channels_last if cfg.spec_channels_last else torch.contiguous_format

    def forward(self, wav: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        spec = torch.stft(wav, self.n_fft, self.hop, self.win, self.window.to(wav.dtype), return_complex=True)
        power = torch.view_as_real(spec).pow(2).sum(-1)
        x = power.clamp(min=MAGNITUDE_FLOOR).sqrt().transpose(1, 2).unsqueeze(1)  # [B, 1, frames, bins]
        x = x.contiguous(memory_format=self.memory_format)  # the feature maps stay in this layout (same values)
        fmap = []
        for conv in self.convs:
            x = F.leaky_relu(conv(x), self.slope)
            fmap.append(x)
        x = self.conv_post(x)
        fmap.append(x)
        return x.flatten(1), fmap


class HiFTDiscriminator(nn.Module):
    """All period discriminators, then all spectrogram discriminators.

    ``forward(real [B, L], fake [B, L])`` -> ``(real_scores, fake_scores, real_fmaps, fake_fmaps)``, one entry per
    sub-discriminator in that order.
    """

    def __init__(self, cfg: DiscriminatorConfig) -> None:
        super().__init__()
        self.discriminators = nn.ModuleList(
            [PeriodDiscriminator(p, cfg) for p in cfg.periods]
            + [SpecDiscriminator(n, h, w, cfg) for n, h, w in cfg.resolutions]
        )

    def forward(self, real: torch.Tensor, fake: torch.Tensor) -> tuple[Scores, Scores, FeatureMaps, FeatureMaps]:
        both = torch.cat([real, fake], dim=0)
        b = real.shape[0]
        real_scores, fake_scores, real_maps, fake_maps = [], [], [], []
        for d in self.discriminators:
            score, fmap = d(both)
            real_scores.append(score[:b])
            fake_scores.append(score[b:])
            real_maps.append([f[:b] for f in fmap])
            fake_maps.append([f[b:] for f in fmap])
        return real_scores, fake_scores, real_maps, fake_maps

    def score(self, wav: torch.Tensor) -> tuple[Scores, FeatureMaps]:
        """One batch alone, ``wav [B, L]`` -> ``(scores, fmaps)`` in the order of :meth:`forward` (the generator's
        turn scores real audio without a graph and generated audio with one, so it calls this twice)."""
        scores, maps = [], []
        for d in self.discriminators:
            score, fmap = d(wav)
            scores.append(score)
            maps.append(fmap)
        return scores, maps
