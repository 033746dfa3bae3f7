"""The contract between the training launcher and one trainable component (a "stage").

``cadenza train STAGE --config C --data D --out DIR`` builds the stage named STAGE, sets it up on a device with a
``wrap`` function (DistributedDataParallel under torchrun, identity otherwise), then loops: the launcher draws
batches from ``dataset()`` with a ``DistributedSampler`` and ``collate``, calls ``train_step``, logs the returned
metrics (``DIR/metrics.jsonl``, TensorBoard), checkpoints ``state_dict()`` and resumes with ``load_state_dict()``,
and finally calls ``export(DIR)`` to write the component in the layout the inference loader reads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

Wrap = Callable[[nn.Module], nn.Module]


class TrainingStage(ABC):
    """One component's training: data, models, optimisers, one step, export."""

    # True when ``state_dict`` and ``export`` are collectives (sharded weights): every rank calls them, rank 0 writes.
    # Otherwise only rank 0 calls them.
    collective_state: bool = False
    # False for a stage that always computes in float32 (``train.mixed_precision`` is then not applied, and the log
    # says so).
    autocast: bool = True

    name: ClassVar[str]

    def __init__(self, config: dict[str, Any], data_dir: Path) -> None:
        self.config = config
        self.data_dir = Path(data_dir)

    @abstractmethod
    def setup(self, device: torch.device, wrap: Wrap) -> None:
        """Build models and optimisers on ``device``; pass every module that receives gradients through ``wrap``."""

    @abstractmethod
    def dataset(self) -> torch.utils.data.Dataset:
        """Map-style dataset of training items (the launcher shards it across ranks). If it has ``set_epoch(epoch)``,
        the launcher calls it before each epoch (and on resume), so random draws per item can be keyed on the epoch
        rather than on a counter that a resume or the loader workers would reset."""

    @abstractmethod
    def collate(self, items: Sequence[Any]) -> Any:
        """Items -> one batch (tensors on the CPU; ``train_step`` moves them)."""

    @abstractmethod
    def train_step(self, batch: Any, step: int) -> dict[str, float]:
        """Forward, backward and optimiser step(s) for one batch; returns metrics including ``"loss"``."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: model, optimiser and scheduler states (tensors and plain data only)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...

    @abstractmethod
    def export(self, out_dir: Path) -> None:
        """Write the trained component where the inference loader expects it (e.g. ``llm.pt``, ``flow.pt``)."""


STAGES: dict[str, type[TrainingStage]] = {}


def register(cls: type[TrainingStage]) -> type[TrainingStage]:
    """Class decorator: make a stage available to ``cadenza train NAME``."""
    STAGES[cls.name] = cls
    return cls
