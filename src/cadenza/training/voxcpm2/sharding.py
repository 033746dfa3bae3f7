"""``voxcpm2.fsdp``: the model's weights, gradients and optimiser state sharded over the torchrun ranks (FSDP2).

Each MiniCPM-4 decoder layer (of the base LM, the residual LM, the LocEnc and the LocDiT) is one ``fully_shard``
unit, gathered just before its forward (and again for its backward) and freed after; the root unit holds the rest
(embeddings, bridge projections, stop head, the LocDiT's in/out projections). ``fully_shard`` swaps the modules'
classes in place, so parameter names stay those of the release.

Checkpoints stay in the unsharded layout: ``full_state`` gathers each tensor (one all-gather per tensor, every rank
takes part) and only rank 0 keeps it, so a checkpoint written by a sharded run resumes an unsharded one and the other
way round, at any world size. ``shard_like`` turns such full tensors back into this rank's shards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from cadenza.models.voxcpm2.minicpm4 import MiniCPMDecoderLayer


def shard(root: nn.Module) -> int:
    """Shard ``root`` in place (every decoder layer its own unit, then ``root``); returns the number of layers.
    Needs the torchrun process group (``training/distributed.py``)."""
    from torch.distributed.fsdp import fully_shard

    layers = [m for m in root.modules() if isinstance(m, MiniCPMDecoderLayer)]
    for layer in layers:
        fully_shard(layer)
    fully_shard(root)
    return len(layers)


def _is_sharded(t: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full_tensor(t: torch.Tensor, keep: bool) -> torch.Tensor | None:
    """The whole of ``t`` (a collective if ``t`` is sharded), detached and on the CPU where ``keep``, else None."""
    if _is_sharded(t):
        t = t.full_tensor()
    return t.detach().cpu().clone() if keep else None


def full_state(state: Mapping[str, torch.Tensor], keep: bool) -> dict[str, torch.Tensor]:
    """A state dict with every sharded tensor gathered whole (all ranks call this, in the same key order); the
    tensors on the CPU where ``keep`` (rank 0), an empty dict elsewhere."""
    out = {k: full_tensor(v, keep) for k, v in state.items()}
    return out if keep else {}


def full_optimizer_state(optimizer: torch.optim.Optimizer, keep: bool) -> dict[str, Any]:
    """``optimizer.state_dict()`` with its sharded per-parameter tensors gathered whole (a collective, as
    ``full_state``); the layout of an unsharded run's. Empty where not ``keep``."""
    sd = optimizer.state_dict()
    state = {i: {k: full_tensor(v, keep) if torch.is_tensor(v) else v for k, v in s.items()}
             for i, s in sorted(sd["state"].items())}
    return {"state": state, "param_groups": sd["param_groups"]} if keep else {}


def shard_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A full tensor as this rank's shard of ``like``'s layout (``value`` itself when ``like`` is not sharded)."""
    if not _is_sharded(like) or value.shape != like.shape:
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value.to(device=like.device, dtype=like.dtype), like.device_mesh, like.placements)


def sharded_state(state: Mapping[str, torch.Tensor], module: nn.Module) -> dict[str, torch.Tensor]:
    """Full tensors keyed like ``module.state_dict()`` -> this rank's shards (unknown keys pass through, for the
    strict loaders to name)."""
    own = module.state_dict()
    return {k: shard_like(v, own[k]) if k in own else v for k, v in state.items()}


def sharded_optimizer_state(state: Mapping[str, Any], params: list[torch.Tensor]) -> dict[str, Any]:
    """``full_optimizer_state``'s layout -> one ``optimizer.load_state_dict`` takes for the sharded ``params``."""
    out = {}
    for i, s in state["state"].items():
        p = params[int(i)] if int(i) < len(params) else None
        out[i] = {k: shard_like(v, p) if p is not None and torch.is_tensor(v) else v for k, v in s.items()}
    return {"state": out, "param_groups": state["param_groups"]}
