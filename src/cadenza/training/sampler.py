"""A ``DistributedSampler`` that can start in the middle of an epoch (for ``--resume``).

The order of an epoch is a function of (seed, epoch) only — ``torch.randperm`` with a generator seeded
``seed + epoch`` — and the same for any number of replicas, so N ranks see exactly the union of what one process
with an N times larger batch sees. ``set_start(k)`` skips this rank's first ``k`` indices of the epoch.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import Dataset, DistributedSampler


class ResumableDistributedSampler(DistributedSampler):
    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_start(self, start: int) -> None:
        """Skip this rank's first ``start`` indices of the current epoch (call after ``set_epoch``)."""
        self.start = max(0, int(start))

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start :])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start)
