"""Conditional flow matching sampler of the CosyVoice 2 flow (``CausalConditionalCFM``).

Sampler: docs/design.md, "CosyVoice 2 flow"; training loss: docs/training.md, "Stage flow".

Inference integrates ``dx/dt = v(x, t)`` from fixed noise at t=0 to a mel at t=1 with Euler steps on a cosine
time grid, evaluating the estimator on a batch of two (conditional, unconditional) and mixing them with
classifier-free guidance ``v = (1 + w) v_cond - w v_uncond``.

The initial noise is **fixed**: frames ``[0, T)`` of one ``[1, mel, noise_frames]`` standard-normal tensor drawn
once from a private ``torch.Generator`` seeded with ``noise_seed`` (the reference draws it with
``torch.manual_seed(0)``, reseeding every global RNG as a side effect; we do not). Using the same noise from frame
0 on every call is what makes re-running the flow on a growing token prefix reproduce earlier frames, and what
lets incremental inference (one ``StreamCache`` per Euler step, ``frame_offset`` = cached frames) take the noise of
the new frames only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.errors import InputError
from cadenza.layers.stream_cache import StreamCache
from cadenza.models.cosyvoice2.config import CFMConfig


def fixed_noise(mel_bins: int, frames: int, seed: int) -> torch.Tensor:
    """``[1, mel_bins, frames]`` float32 on CPU, equal to ``torch.manual_seed(seed); torch.randn(1, mel_bins, frames)``
    (a private generator: the global RNG is left alone)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    with torch.inference_mode(False):
        return torch.randn(1, mel_bins, frames, generator=generator, device="cpu", dtype=torch.float32)


def time_grid(n_timesteps: int, scheduler: str, device=None, dtype=torch.float32) -> torch.Tensor:
    """``[n_timesteps + 1]`` times from 0 to 1: linear, or ``1 - cos(pi/2 * k/n)`` for ``"cosine"``."""
    t_span = torch.linspace(0, 1, n_timesteps + 1, device=device, dtype=dtype)
    if scheduler == "cosine":
        t_span = 1 - torch.cos(t_span * 0.5 * math.pi)
    return t_span


class ConditionalFlowMatching(nn.Module):
    """Wraps the velocity ``estimator`` (the U-Net; attribute name from the checkpoint) with sampling and loss."""

    def __init__(self, cfg: CFMConfig, estimator: nn.Module, mel_bins: int) -> None:
        super().__init__()
        self.estimator = estimator
        self.mel_bins = mel_bins
        self.sigma_min = cfg.sigma_min
        self.t_scheduler = cfg.t_scheduler
        self.training_cfg_rate = cfg.training_cfg_rate
        self.inference_cfg_rate = cfg.inference_cfg_rate
        self.n_timesteps = cfg.n_timesteps
        # A plain attribute, not a buffer: it stays out of the state dict and survives ``to_empty`` / meta builds.
        # Scaled once by the inference temperature, so every path that reads it (whole, streamed, incremental) does.
        self.rand_noise = fixed_noise(mel_bins, cfg.noise_frames, cfg.noise_seed) * cfg.inference_temperature
        self._noise_copy: torch.Tensor | None = None  # rand_noise on the last device/dtype used

    @property
    def compute_dtype(self) -> torch.dtype:
        """The estimator's dtype (its inputs are cast to it; the ODE state and the output stay float32)."""
        return self.estimator.time_mlp.linear_1.weight.dtype

    def set_compute_dtype(self, dtype: torch.dtype) -> None:
        """Run the estimator in ``dtype`` (weights cast in place). The Euler state, time grid and CFG mix stay in the
        caller's dtype: only the estimator's matrix products and convolutions get cheaper."""
        self.estimator.to(dtype)

    def initial_noise(self, frames: int, device: torch.device, dtype: torch.dtype, start: int = 0) -> torch.Tensor:
        """``[1, mel, frames - start]``: frames ``start .. frames-1`` of the fixed noise."""
        if frames > self.rand_noise.size(2):
            raise InputError(
                f"the flow can generate at most {self.rand_noise.size(2)} mel frames per call "
                f"(prompt included), got {frames}; split the text into shorter sentences"
            )
        noise = self._noise_copy
        if noise is None or noise.device != device or noise.dtype != dtype:
            with torch.inference_mode(False):
                noise = self.rand_noise.to(device=device, dtype=dtype)
            self._noise_copy = noise
        return noise[:, :, start:frames]

    @torch.inference_mode()
    def forward(
        self,
        mu: torch.Tensor,
        mask: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        n_timesteps: int | None = None,
        temperature: float = 1.0,
        streaming: bool = False,
        caches: Sequence[StreamCache] | None = None,
        frame_offset: int = 0,
    ) -> torch.Tensor:
        """mu, cond ``[B, mel, T]``; mask ``[B, 1, T]``; spks ``[B, mel]`` -> mel ``[B, mel, T]`` float32.

        Incremental: the T frames start at ``frame_offset`` of the utterance (their noise is taken from there) and
        ``caches`` holds one estimator ``StreamCache`` per Euler step (positioned by the caller).
        """
        frames = frame_offset + mu.size(2)
        z = self.initial_noise(frames, mu.device, mu.dtype, frame_offset).expand(mu.size(0), -1, -1) * temperature
        t_span = time_grid(n_timesteps or self.n_timesteps, self.t_scheduler, mu.device, mu.dtype)
        return self.solve_euler(z, t_span, mu, mask, spks, cond, streaming, caches)

    def solve_euler(
        self,
        x: torch.Tensor,
        t_span: torch.Tensor,
        mu: torch.Tensor,
        mask: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        streaming: bool = False,
        caches: Sequence[StreamCache] | None = None,
    ) -> torch.Tensor:
        """Euler steps over ``t_span`` with CFG; x ``[B, mel, T]`` at t_span[0] -> x at t_span[-1] (float32).

        ``caches``: one estimator ``StreamCache`` per step (incremental inference), or None."""
        steps = t_span.numel() - 1
        if caches is not None and len(caches) != steps:
            raise ValueError(f"need one stream cache per Euler step ({steps}), got {len(caches)}")
        # The reference advances t by accumulating dt (t += dt, dt = t_span[k+1] - t) rather than reading t_span[k];
        # kept for bit-level agreement of the time embedding.
        t = t_span[0].unsqueeze(0)
        dt = t_span[1] - t_span[0]
        b = x.size(0)
        # Row block 0 is conditional, block 1 unconditional (mu = spks = cond = 0).
        mask_in = torch.cat([mask, mask], dim=0)
        mu_in = torch.cat([mu, torch.zeros_like(mu)], dim=0)
        spks_in = torch.cat([spks, torch.zeros_like(spks)], dim=0)
        cond_in = torch.cat([cond, torch.zeros_like(cond)], dim=0)
        w = self.inference_cfg_rate
        dtype = self.compute_dtype
        cast = dtype != x.dtype  # a lower-precision estimator: inputs cast in, velocity back out (t stays as is)
        if cast:
            mask_in, mu_in, spks_in, cond_in = (a.to(dtype) for a in (mask_in, mu_in, spks_in, cond_in))
        for step in range(1, steps + 1):
            x_in = torch.cat([x, x], dim=0)
            t_in = t.expand(2 * b)
            cache = None if caches is None else caches[step - 1]
            if cast:
                v = self.estimator(x_in.to(dtype), mask_in, mu_in, t_in, spks_in, cond_in, streaming=streaming,
                                   cache=cache).to(x.dtype)
            else:
                v = self.estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, streaming=streaming, cache=cache)
            v_cond, v_uncond = torch.split(v, [b, b], dim=0)
            v = (1.0 + w) * v_cond - w * v_uncond
            x = x + dt * v
            t = t + dt
            if step < steps:
                dt = t_span[step + 1] - t
        return x.float()

    def compute_loss(
        self,
        x1: torch.Tensor,
        mask: torch.Tensor,
        mu: torch.Tensor,
        spks: torch.Tensor | None = None,
        cond: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        streaming: bool = False,
        *,
        loss_mask: torch.Tensor | None = None,
        chunk_sizes: torch.Tensor | None = None,
        t: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
        cfg_keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training loss. x1, mu, cond ``[B, mel, T]``; mask ``[B, 1, T]``; spks ``[B, mel]``.

        Objective: docs/training.md, "Stage flow".

        ``t ~ U(0,1)`` (no cosine warping), ``y = (1 - (1 - sigma_min) t) z + t x1``, target
        ``u = x1 - (1 - sigma_min) z``; with probability ``training_cfg_rate`` per utterance mu, spks and cond are
        zeroed. Returns (masked MSE averaged over the frames of ``loss_mask`` (default ``mask``) x mel bins, y).
        Random draws, in order: t, z, the CFG keep mask, all from ``generator`` when given; a caller that needs
        per-utterance streams (reproducible across batch layouts) passes ``t [B]``, ``z`` (like x1) and
        ``cfg_keep [B]`` (bool) instead. ``chunk_sizes [B]``: per-row estimator attention chunk (see the estimator).
        """
        b = mu.size(0)
        t = torch.rand(b, device=mu.device, dtype=mu.dtype, generator=generator) if t is None else t.to(mu)
        t = t.view(b, 1, 1)
        z = torch.randn(x1.shape, device=x1.device, dtype=x1.dtype, generator=generator) if z is None else z.to(x1)
        y = (1 - (1 - self.sigma_min) * t) * z + t * x1
        u = x1 - (1 - self.sigma_min) * z
        if self.training_cfg_rate > 0 or cfg_keep is not None:
            if cfg_keep is None:
                cfg_keep = torch.rand(b, device=x1.device, generator=generator) > self.training_cfg_rate
            keep = cfg_keep.to(device=mu.device, dtype=mu.dtype)
            mu = mu * keep.view(-1, 1, 1)
            spks = None if spks is None else spks * keep.view(-1, 1)
            cond = None if cond is None else cond * keep.view(-1, 1, 1)
        pred = self.estimator(y, mask, mu, t.view(b), spks, cond, streaming=streaming, chunk_sizes=chunk_sizes)
        weight = mask if loss_mask is None else loss_mask
        loss = F.mse_loss(pred * weight, u * weight, reduction="sum") / (torch.sum(weight) * u.size(1)).clamp(min=1)
        return loss, y
