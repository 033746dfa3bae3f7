"""Optimiser, learning-rate schedule and the clipped optimiser step, built from ``train.optim`` (``OptimConfig``).

Stages own their optimisers (the stage contract); this module gives them one consistent implementation of the
launcher's lr schedule and gradient clipping knobs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import torch
from torch import nn

from cadenza.training.config import OptimConfig

log = logging.getLogger(__name__)


def lr_factor(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Multiplier of ``cfg.lr`` for optimiser step ``step`` (0-based)."""
    s = step + 1
    w = cfg.warmup_steps
    if cfg.schedule == "inverse_sqrt":
        return min(s / w, math.sqrt(w / s)) if w > 0 else 1.0 / math.sqrt(s)
    if w > 0 and s <= w:
        return s / w
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (s - w) / max(1, max_steps - w))
    decay = 1.0 - progress if cfg.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay


def build_optimizer(params: Iterable[nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    # A closure (a plain function) so that LambdaLR.state_dict() stays plain data (it stores None for functions).
    def factor(step: int) -> float:
        return lr_factor(step, cfg, max_steps)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Optimization:
    """One optimiser + its schedule + clipping: ``step(loss)`` = backward, clip, optimiser step, schedule step."""

    def __init__(self, params: Iterable[nn.Parameter], cfg: OptimConfig, max_steps: int) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.cfg = cfg
        self.optimizer = build_optimizer(self.params, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg, max_steps)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def step(self, loss: torch.Tensor) -> float:
        """Backward ``loss`` and take one optimiser step; returns the gradient norm before clipping."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        else:
            grads = [p.grad.detach().norm() for p in self.params if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack(grads)) if grads else torch.zeros(())
        self.optimizer.step()
        self.scheduler.step()
        return float(norm)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        apply_config_after_resume(self.optimizer, self.scheduler, self.cfg)


def apply_config_after_resume(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                              cfg: OptimConfig) -> None:
    """After loading a checkpoint's optimiser and schedule: its moments and step stay, its hyper-parameters give way
    to the config's. A checkpoint carries its run's lr, betas, eps and weight decay (the param groups and the
    scheduler's ``base_lrs``), which would otherwise silently override a config edited before ``--resume`` (a
    lower lr to finish a round, say); what changed is logged."""
    group = optimizer.param_groups[0]
    wanted = {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    saved = {"lr": scheduler.base_lrs[0], "betas": tuple(group["betas"]), "eps": group["eps"],
             "weight_decay": group["weight_decay"]}
    changed = [f"{key} {saved[key]} -> {wanted[key]}" for key in wanted if saved[key] != wanted[key]]
    if changed:
        log.info("resume: train.optim from the config, not the checkpoint: %s", ", ".join(changed))
    factor = scheduler.lr_lambdas[0](scheduler.last_epoch)  # LambdaLR: lr = base_lr x factor(steps taken)
    scheduler.base_lrs = [cfg.lr for _ in optimizer.param_groups]
    for group in optimizer.param_groups:
        group.update(lr=cfg.lr * factor, initial_lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                     weight_decay=cfg.weight_decay)
