"""What a caller holds for one submitted request: ``StreamHandle`` (its audio chunks, its bi-streaming text)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np
import torch

from cadenza.engine.scheduled_job import DONE, Job


class JobChannel(Protocol):
    """What a handle needs of whoever runs its job (the scheduler): deliver text, take audio, cancel."""

    def feed(self, job: Job, item: object) -> None: ...

    def take(self, job: Job) -> object: ...

    def cancel(self, job: Job) -> None: ...


class StreamHandle:
    """Iterate for float32 audio chunks. ``close()``/``cancel()`` (or dropping the iterator) frees the request.

    For bi-streaming requests, ``feed_text(ids)`` and ``end_text()`` deliver the text as it arrives; for a live
    voice conversion ``feed_source(ids)`` and ``end_source()`` its source's speech tokens.
    """

    def __init__(self, channel: JobChannel, job: Job) -> None:
        self._channel, self._job = channel, job

    @property
    def first_chunk_seconds(self) -> float | None:
        return self._job.first_chunk_s

    def feed_text(self, ids: torch.Tensor) -> None:
        self._channel.feed(self._job, ids)

    def end_text(self) -> None:
        self._channel.feed(self._job, DONE)

    def feed_source(self, ids: list[int]) -> None:
        """More speech token ids of a live voice conversion's source (``SynthesisRequest.live_source``)."""
        self._channel.feed(self._job, list(ids))

    def end_source(self) -> None:
        """A live source ended: its last chunk is made."""
        self._channel.feed(self._job, DONE)

    def fail(self, exc: BaseException) -> None:
        """The text source failed: end the request with ``exc`` (the consumer sees it)."""
        self._channel.feed(self._job, exc)

    def __iter__(self) -> Iterator[np.ndarray]:
        try:
            while (item := self._channel.take(self._job)) is not DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()

    def cancel(self) -> None:
        self._channel.cancel(self._job)
