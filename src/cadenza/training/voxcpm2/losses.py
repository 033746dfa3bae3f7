"""VoxCPM 2 training losses: teacher-forced LM pass, flow-matching loss of the LocDiT, stop loss.

See docs/design.md, "VoxCPM 2 training".

Teacher forcing: the state at position t comes from position t-1 (zeros at t = 0): ``lm_h[t] = e'[t-1]`` with
``e' = FSQ(e)·am + e·tm`` (FSQ straight-through in train mode), ``res_h[t] = RALM(fusion([e' ‖ am·emb]))[t-1]``,
DiT condition ``mu[t] = [lm_to_dit(lm_h[t]) ‖ res_to_dit(res_h[t])]`` and prefix patch ``cond[t] = patch[t-1]``.
Every position goes through the DiT; the masks select what counts.

Flow matching (``flow_matching_loss``), random draws in this order (``TrainingNoise`` records or replays them):
1. ``rand [N]``: CFG dropout, ``mu ← mu · (u > training_cfg_rate)``;
2. ``rand [N]``: noisy-prefix mask ``u > 1 - (p0 + progress·(p1 - p0))`` and 3. ``randn [N, D, P]``: its noise, scaled
   by ``noise_cond_scale`` (0 in the release: drawn but without effect);
4-6. log-norm times: ``randn [N]`` for r, ``randn [N]`` for t (``sigmoid(N(-0.4, 1))``), ``rand [N]`` for the
   r ≠ t mask (never true without mean mode); with the ``uniform`` scheduler ``rand`` replaces both ``randn``;
7. ``randn [N, D, P]``: the flow noise z. ``y = (1 - t)·x1 + t·z``, target ``v = z - x1``, prediction
   ``u = estimator(y, mu, t, cond, t - r)``; squared error averaged over D -> ``[N, P]``, summed under the mask and
   divided by ``max(Σ mask, 1)`` (the reference's adaptive weighting has exponent 0: weights = mask).

Stop loss: cross-entropy of ``stop_head(silu(stop_proj(lm_h)))`` against the labels, summed over ``loss_mask``
and divided by ``max(Σ loss_mask, 1)``. Total = ``Σ λ·loss / grad_accum`` with λ = 1 for both.
Mean-flow training (``dit_mean_mode``, needs a JVP) is not implemented (off in the release).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cadenza.errors import CheckpointError, InputError
from cadenza.models.voxcpm2.config import TRAINING_T_SCHEDULERS, CFMConfig
from cadenza.models.voxcpm2.local_dit import LocalDiT
from cadenza.models.voxcpm2.model import VoxCPM2Model
from cadenza.training.voxcpm2.packer import PackedBatch

LOG_NORM_MEAN, LOG_NORM_STD = -0.4, 1.0  # time sampling of the reference (sigmoid of a normal)


class TrainingNoise:
    """Source of the loss's random draws: a ``torch.Generator`` (default: a fresh one), or tensors replayed in call
    order (shapes checked). ``drawn`` records every draw as ``(kind, tensor)``."""

    def __init__(self, generator: torch.Generator | None = None, replay: Sequence[torch.Tensor] | None = None) -> None:
        if generator is not None and replay is not None:
            raise InputError("give a generator or tensors to replay, not both")
        if generator is None and replay is None:
            generator = torch.Generator()
            generator.seed()
        self.generator = generator
        self.replay = list(replay) if replay is not None else None
        self.drawn: list[tuple[str, torch.Tensor]] = []

    def _draw(self, kind: str, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        if self.replay is not None:
            i = len(self.drawn)
            if i >= len(self.replay):
                raise InputError(f"replayed training noise has {len(self.replay)} draws; draw {i} ({kind}) needs one more")
            t = self.replay[i]
            if tuple(t.shape) != tuple(shape):
                raise InputError(f"replayed draw {i} ({kind}) has shape {tuple(t.shape)}, expected {tuple(shape)}")
        else:
            fn = torch.rand if kind == "rand" else torch.randn
            t = fn(shape, generator=self.generator, device=self.generator.device)
        t = t.to(device=like.device, dtype=dtype or like.dtype)
        self.drawn.append((kind, t))
        return t

    def rand(self, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Uniform [0, 1) on ``like``'s device, in ``dtype`` (default: ``like``'s dtype)."""
        return self._draw("rand", shape, like, dtype)

    def randn(self, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self._draw("randn", shape, like, dtype)


class ItemNoise(TrainingNoise):
    """Draws made row block by row block: packed row ``b`` takes its first ``lengths[b]`` positions from its own
    generator (the padding gets zeros), so an item's noise does not depend on the batch it was packed into, and N
    processes train like one with an N times larger batch. Draw ``[B·T, ...]`` shapes only."""

    def __init__(self, generators: Sequence[torch.Generator], lengths: Sequence[int], seq_len: int) -> None:
        super().__init__(replay=[])
        if len(generators) != len(lengths) or any(not 0 < n <= seq_len for n in lengths):
            raise InputError("ItemNoise needs one generator per row and row lengths in [1, seq_len]")
        self.generators, self.lengths, self.seq_len = list(generators), list(lengths), seq_len

    def _draw(self, kind: str, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        t, rows = self.seq_len, len(self.lengths)
        if shape[0] != rows * t:
            raise InputError(f"ItemNoise draws [{rows}·{t}, ...] tensors, asked for {tuple(shape)}")
        fn = torch.rand if kind == "rand" else torch.randn
        out = torch.zeros(shape)
        for b, (g, n) in enumerate(zip(self.generators, self.lengths)):
            out[b * t : b * t + n] = fn((n, *shape[1:]), generator=g)
        out = out.to(device=like.device, dtype=dtype or like.dtype)
        self.drawn.append((kind, out))
        return out


@dataclass
class LossOutput:
    diff: torch.Tensor  # scalar diffusion (flow-matching) loss
    stop: torch.Tensor  # scalar stop loss

    def total(self, diff_weight: float = 1.0, stop_weight: float = 1.0, grad_accum_steps: int = 1) -> torch.Tensor:
        return (diff_weight * self.diff + stop_weight * self.stop) / grad_accum_steps


def flow_matching_loss(
    estimator: LocalDiT,
    cfm: CFMConfig,
    x1: torch.Tensor,
    mu: torch.Tensor,
    cond: torch.Tensor,
    mask: torch.Tensor,
    noise: TrainingNoise,
    progress: float = 0.0,
    mean_mode: bool = False,
) -> torch.Tensor:
    """x1 ``[N, D, P]`` target patches, mu ``[N, 2·Hd]``, cond ``[N, D, P]`` prefix patches, mask ``[N, P]`` -> loss."""
    if mean_mode:
        raise NotImplementedError("mean-flow (dit_mean_mode) training needs a JVP and is not implemented")
    n = x1.shape[0]
    if cfm.training_cfg_rate > 0:
        # the two mask draws are float32 whatever the model dtype (reference: plain torch.rand)
        mu = mu * (noise.rand((n,), x1, torch.float32) > cfm.training_cfg_rate).to(mu.dtype)[:, None]
    p0, p1 = cfm.noise_cond_prob_range
    noisy = noise.rand((n,), x1, torch.float32) > 1.0 - (p0 + progress * (p1 - p0))
    cond = cond + noisy.to(cond.dtype)[:, None, None] * noise.randn(tuple(cond.shape), cond) * cfm.noise_cond_scale
    if cfm.t_scheduler == "log-norm":
        r = torch.sigmoid(noise.randn((n,), x1) * LOG_NORM_STD + LOG_NORM_MEAN)
        t = torch.sigmoid(noise.randn((n,), x1) * LOG_NORM_STD + LOG_NORM_MEAN)
    elif cfm.t_scheduler == "uniform":
        r, t = noise.rand((n,), x1), noise.rand((n,), x1)
    else:  # the config loads for inference (which ignores it); training cannot guess a schedule, as the reference
        raise CheckpointError(f"cfm_config.t_scheduler {cfm.t_scheduler!r} cannot be trained: use one of "
                              f"{TRAINING_T_SCHEDULERS}")
    r_neq_t = noise.rand((n,), x1) < 0.0  # ratio_r_neq_t = 0 without mean mode
    r = torch.where(r_neq_t, torch.minimum(r, t), t)
    t = torch.where(r_neq_t, torch.maximum(r, t), t)
    z = noise.randn(tuple(x1.shape), x1)
    tt = t.detach()[:, None, None]
    y = (1 - tt) * x1 + tt * z
    target = z - x1
    pred = estimator(y, mu, t, cond, t - r)
    errors = F.mse_loss(pred, target.detach(), reduction="none").mean(dim=1)  # [N, P]
    return (mask * errors).sum() / torch.clamp(mask.sum(), min=1.0)


def voxcpm2_losses(
    model: VoxCPM2Model, batch: PackedBatch, progress: float = 0.0, noise: TrainingNoise | None = None
) -> LossOutput:
    """Diffusion and stop losses of a packed batch (set ``model.train()`` for the straight-through FSQ)."""
    noise = noise or TrainingNoise()
    device, dtype = model.device, model.dtype
    ids = batch.text_tokens.to(device, torch.long)
    tm = batch.text_mask.to(device, dtype)[..., None]
    am = batch.audio_mask.to(device, dtype)[..., None]
    loss_mask = batch.loss_mask.to(device, dtype)
    labels = batch.labels.to(device, torch.long)
    feats = batch.audio_feats.to(device, dtype)
    b, t, p, d = feats.shape

    def shifted(x: torch.Tensor) -> torch.Tensor:  # state at t from position t-1, zeros at t = 0
        return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)

    feat_emb = model.embed_patches(feats)
    enc = model.base_lm(tm * model.embed_text(ids) + am * feat_emb, causal=True)
    enc = model.fsq_layer(enc) * am + enc * tm
    res = model.residual_lm(model.fusion_concat_proj(torch.cat((enc, am * feat_emb), dim=-1)), causal=True)
    lm_hidden = shifted(enc)
    mu = model.dit_condition(lm_hidden, shifted(res)).reshape(b * t, -1)
    x1 = feats.reshape(b * t, p, d).transpose(1, 2).contiguous()
    cond = shifted(feats).reshape(b * t, p, d).transpose(1, 2).contiguous()
    mask = loss_mask.reshape(b * t, 1).expand(b * t, p)
    diff = flow_matching_loss(
        model.feat_decoder.estimator, model.config.dit_config.cfm_config, x1, mu, cond, mask, noise, progress,
        model.config.dit_config.dit_mean_mode,
    )
    stop_losses = F.cross_entropy(model.stop_logits(lm_hidden).transpose(1, 2), labels, reduction="none")
    stop = (stop_losses * loss_mask).sum() / torch.clamp(loss_mask.sum(), min=1.0)
    return LossOutput(diff=diff, stop=stop)
