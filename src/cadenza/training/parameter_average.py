"""An exponential moving average of a module's parameters, kept beside training and exported instead of the
last step's weights.

Why: a GAN's generator moves a lot from step to step on small batches (cadenza-tiny's vocoder, batch 6 on one CPU
core, read WER 0.115 at one checkpoint and 0.147 three hundred steps later; docs/cadenza-tiny.md, "Quality"), so
which checkpoint is exported is partly luck. The average over the last ~1/(1 - decay) steps smooths that out, as
GAN generators are commonly sampled (StyleGAN, BigGAN).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from cadenza.errors import CheckpointError, InputError


class ParameterAverage:
    """``average = decay_t * average + (1 - decay_t) * parameter`` after every optimiser step, with
    ``decay_t = min(decay, (1 + t) / (10 + t))`` (t = updates so far), so the first updates follow the weights
    closely and a run from scratch is not averaged with its random start. Buffers are not averaged: the averaged
    module takes the live module's buffers when it is built (:meth:`averaged_module`).
    """

    def __init__(self, module: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise InputError(f"the parameter average's decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.updates = 0
        self.average = {name: p.detach().clone() for name, p in module.named_parameters()}

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        """Move the average towards ``module``'s current parameters (call after each optimiser step)."""
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        names, params = zip(*module.named_parameters(), strict=True)
        if set(names) != set(self.average):
            raise CheckpointError("the averaged parameters do not match the module's")
        torch._foreach_lerp_([self.average[n] for n in names], [p.detach() for p in params], 1.0 - decay)
        self.updates += 1

    @torch.no_grad()
    def averaged_module(self, module: nn.Module) -> nn.Module:
        """A copy of ``module`` (its structure and buffers) holding the averaged parameters."""
        out = copy.deepcopy(module)
        for name, p in out.named_parameters():
            p.copy_(self.average[name])
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates,
                "average": {k: v.detach().cpu() for k, v in self.average.items()}}

    @torch.no_grad()
    def resume(self, state: dict[str, Any] | None, module: nn.Module) -> None:
        """Continue from a checkpoint: its average ``state`` when it has one, else (a checkpoint of a run without an
        average, continued with one) start afresh from ``module``'s weights, which the checkpoint just set."""
        if state is not None:
            self.load_state_dict(state)
            return
        names = dict(module.named_parameters())
        if set(names) != set(self.average) or any(names[k].shape != v.shape for k, v in self.average.items()):
            raise CheckpointError("the averaged parameters do not match the module's")
        self.updates = 0
        for k, v in self.average.items():
            v.copy_(names[k])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        average = state["average"]
        if set(average) != set(self.average) or any(average[k].shape != v.shape for k, v in self.average.items()):
            raise CheckpointError("the checkpoint's parameter average does not match the model")
        self.updates = int(state["updates"])
        for k, v in self.average.items():
            v.copy_(average[k])
