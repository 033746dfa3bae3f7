"""Single-process or ``torchrun`` (DistributedDataParallel) execution: process group, device, wrap, reductions.

``torchrun --nproc_per_node N`` sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``;
with ``WORLD_SIZE > 1`` we join the group from those variables (``env://``), with NCCL on GPUs and gloo on CPUs.
Without them everything runs in one process and every collective below is the identity.

Losses that average over tokens or frames must average over the *global* batch for N processes to train exactly
like one process with an N times larger batch (DDP averages the ranks' gradients, not their token counts):
``global_mean_count`` gives the per-rank denominator that makes that so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cadenza.errors import InputError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    initialized_here: bool = False  # we created the process group (and destroy it at the end)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return default if value is None else int(value)
    except ValueError as exc:
        raise InputError(f"environment variable {name}={value!r} is not an integer") from exc


def pick_device(preference: str, local_rank: int) -> torch.device:
    """``auto``: CUDA (``cuda:LOCAL_RANK``) when available, else CPU."""
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InputError("train.device is 'cuda' but no CUDA device is available")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def init_distributed(device_preference: str = "auto") -> DistInfo:
    """Join the torchrun process group if ``WORLD_SIZE > 1`` (or reuse one that exists) and pick the device."""
    world = _env_int("WORLD_SIZE", 1)
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    device = pick_device(device_preference, local_rank)
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), local_rank, dist.get_world_size(), device)
    if world <= 1:
        return DistInfo(0, 0, 1, device)
    if not dist.is_available():
        raise InputError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world)
    log.info("joined process group: rank %d/%d (%s, %s)", rank, world, backend, device)
    return DistInfo(rank, local_rank, world, device, initialized_here=True)


def cleanup(info: DistInfo) -> None:
    if info.initialized_here and dist.is_initialized():
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def make_wrap(info: DistInfo) -> Callable[[nn.Module], nn.Module]:
    """The stage contract's ``wrap``: DDP under torchrun, identity otherwise."""
    if info.world_size <= 1:
        return lambda module: module

    def wrap(module: nn.Module) -> nn.Module:
        ids = [info.device.index] if info.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(module, device_ids=ids)

    return wrap


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (or the module itself)."""
    return module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if is_distributed():
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def global_mean_count(count: torch.Tensor | float, device: torch.device | None = None) -> torch.Tensor:
    """Mean over ranks of a per-rank count (tokens, frames, pairs) — the denominator for a rank's loss sum.

    With ``loss_r = sum_r / global_mean_count(count_r)`` the DDP average over ranks equals ``sum / count`` of the
    union batch. Clamped at 1 so that an empty batch gives a zero loss, not NaN.
    """
    t = torch.as_tensor(count, dtype=torch.float64, device=device).detach()
    return (all_reduce_sum(t) / world_size()).clamp(min=1.0).float()


def mean_over_ranks(metrics: dict[str, float], device: torch.device) -> dict[str, float]:
    """Average each metric over ranks (every rank must call this at the same step)."""
    if not is_distributed() or not metrics:
        return dict(metrics)
    keys = sorted(metrics)
    t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=device)
    t = all_reduce_sum(t) / world_size()
    return dict(zip(keys, t.tolist()))


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (in rank order); ``[obj]`` in one process."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if is_distributed():
        dist.barrier()
