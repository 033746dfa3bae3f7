"""What a caller holds for one submitted request: ``StreamHandle`` (its audio chunks, its bi-streaming text)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from cadenza.engine.scheduled_job import Job
    from cadenza.engine.scheduler import Scheduler

DONE = object()  # the end of a request's audio (in its buffer) or text (in its text inbox)


class StreamHandle:
    """Iterate for float32 audio chunks. ``close()``/``cancel()`` (or dropping the iterator) frees the request.

    For bi-streaming requests, ``feed_text(ids)`` and ``end_text()`` deliver the text as it arrives.
    """

    def __init__(self, scheduler: Scheduler, job: Job) -> None:
        self._scheduler, self._job = scheduler, job

    @property
    def first_chunk_seconds(self) -> float | None:
        return self._job.first_chunk_s

    def feed_text(self, ids: torch.Tensor) -> None:
        self._scheduler._feed(self._job, ids)

    def end_text(self) -> None:
        self._scheduler._feed(self._job, DONE)

    def fail(self, exc: BaseException) -> None:
        """The text source failed: end the request with ``exc`` (the consumer sees it)."""
        self._scheduler._feed(self._job, exc)

    def __iter__(self) -> Iterator[np.ndarray]:
        try:
            while (item := self._scheduler._take(self._job)) is not DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()

    def cancel(self) -> None:
        self._scheduler._cancel(self._job)
