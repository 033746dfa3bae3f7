"""Patch sampler: Euler integration of the flow from noise (t = 1) to a latent patch (t = 0).

See docs/design.md, "VoxCPM 2 patch sampler".

* Time grid: ``u = linspace(1, 0, n + 1)`` then sway sampling ``t = u + coef·(cos(pi/2·u) - 1 + u)``, computed in
  the runtime dtype (bf16 grids differ from fp32 ones; the reference does the same).
* CFG-Zero*: the first ``max(1, int((n + 1)·0.04))`` steps use zero velocity, the others mix the conditional and the
  unconditional (``mu = 0``) velocities of one batch of two with the optimised scale
  ``s* = <v_c, v_u> / (|v_u|² + 1e-8)``: ``v = s*·v_u + w·(v_c - s*·v_u)``.
* ``t`` is carried by subtraction (``t ← t - dt``), not re-read from the grid, as in the reference.

The initial noise is an argument: the caller decides where randomness comes from (a private generator or a
replayed tensor); nothing here touches a global RNG.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cadenza.models.voxcpm2.local_dit import LocalDiT

ZERO_INIT_FRACTION = 0.04  # CFG-Zero*: share of the grid (n + 1 points) integrated with zero velocity
CFG_ZERO_STAR_EPS = 1e-8


def time_grid(n_timesteps: int, sway_coef: float = 1.0, device=None, dtype=torch.float32) -> torch.Tensor:
    """``[n + 1]`` times from 1 down to 0 with sway sampling."""
    if n_timesteps < 1:
        raise ValueError(f"n_timesteps must be >= 1, got {n_timesteps}")
    t = torch.linspace(1, 0, n_timesteps + 1, device=device, dtype=dtype)
    return t + sway_coef * (torch.cos(torch.pi / 2 * t) - 1 + t)


def zero_init_steps(n_timesteps: int) -> int:
    """How many leading Euler steps use zero velocity under CFG-Zero* (1 for n < 49)."""
    return max(1, int((n_timesteps + 1) * ZERO_INIT_FRACTION))


class PatchFlowSampler(nn.Module):
    """Holds the estimator (state prefix ``feat_decoder.estimator.``) and integrates it."""

    def __init__(self, estimator: LocalDiT, mean_mode: bool = False) -> None:
        super().__init__()
        self.estimator = estimator
        self.mean_mode = mean_mode  # feed the real dt to the estimator (trained mean-flow); off in the release

    def forward(
        self,
        mu: torch.Tensor,
        cond: torch.Tensor,
        noise: torch.Tensor,
        n_timesteps: int = 10,
        cfg_value: float | Sequence[float] = 2.0,
        sway_coef: float = 1.0,
        use_cfg_zero_star: bool = True,
    ) -> torch.Tensor:
        """mu ``[b, k·Hd]``, cond ``[b, D, P']`` previous patch, noise ``[b, D, P]`` (already times temperature)
        -> patch ``[b, D, P]``. ``cfg_value``: one guidance scale for all rows, or one per row (batched requests)."""
        if not isinstance(cfg_value, (int, float)):
            values = [float(c) for c in cfg_value]
            if len(values) != mu.size(0):
                raise ValueError(f"need one cfg value per row ({mu.size(0)}), got {len(values)}")
            cfg_value = values[0] if len(set(values)) == 1 else values
        t_span = time_grid(n_timesteps, sway_coef, device=mu.device, dtype=mu.dtype)
        x = noise.to(mu.dtype)
        t, dt = t_span[0], t_span[0] - t_span[1]
        n_zero = zero_init_steps(n_timesteps) if use_cfg_zero_star else 0
        for step in range(1, n_timesteps + 1):
            if step <= n_zero:
                velocity = torch.zeros_like(x)
            else:
                velocity = self._guided_velocity(x, mu, t, dt, cond, cfg_value, use_cfg_zero_star)
            x = x - dt * velocity
            t = t - dt
            if step < n_timesteps:
                dt = t - t_span[step + 1]
        return x

    def _guided_velocity(
        self, x: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, dt: torch.Tensor, cond: torch.Tensor,
        cfg_value: float | list[float], use_cfg_zero_star: bool,
    ) -> torch.Tensor:
        """One estimator call on the batch ``[conditional; unconditional (mu = 0)]`` mixed by CFG (per row when
        ``cfg_value`` is a list)."""
        b = x.size(0)
        x_in = torch.cat([x, x])
        mu_in = torch.cat([mu, torch.zeros_like(mu)])
        t_in = t.expand(2 * b)
        dt_in = dt.expand(2 * b) if self.mean_mode else torch.zeros_like(t_in)
        cond_in = torch.cat([cond, cond])
        v_cond, v_uncond = self.estimator(x_in, mu_in, t_in, cond_in, dt_in).split(b)
        if use_cfg_zero_star:
            pos, neg = v_cond.reshape(b, -1), v_uncond.reshape(b, -1)
            scale = (pos * neg).sum(1, keepdim=True) / ((neg**2).sum(1, keepdim=True) + CFG_ZERO_STAR_EPS)
            scale = scale.view(b, *([1] * (x.dim() - 1)))
        else:
            scale = 1.0
        if isinstance(cfg_value, float | int):
            return v_uncond * scale + cfg_value * (v_cond - v_uncond * scale)
        # Rows with the same value are mixed with that Python scalar, the arithmetic of a batch of their own (a
        # tensor of values would round them to the model dtype, or promote bf16 rows to float32).
        out = torch.empty_like(v_cond)
        for value in dict.fromkeys(cfg_value):
            rows = torch.tensor([i for i, c in enumerate(cfg_value) if c == value], device=x.device)
            row_scale = scale[rows] if isinstance(scale, torch.Tensor) else scale
            uncond = v_uncond[rows]
            out[rows] = uncond * row_scale + value * (v_cond[rows] - uncond * row_scale)
        return out
