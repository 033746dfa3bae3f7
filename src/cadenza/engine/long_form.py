"""Long text: several segment requests with the same voice, run a few at a time, joined in order.

Segments share one ``SpeakerPrompt`` (same prompt tokens, mel and x-vector), so voice and pace stay consistent.
Up to ``window`` segments are in the scheduler at once: their LM steps are batched together, and when streaming the
next segment is already being generated while the current one plays, so there is no gap at the joins.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from cadenza.engine.request import SynthesisRequest
from cadenza.engine.scheduler import Scheduler
from cadenza.engine.stream_handle import StreamHandle


def synthesize_segments(scheduler: Scheduler, requests: Sequence[SynthesisRequest], window: int = 4,
                        on_segment: Callable[[int], None] | None = None) -> np.ndarray:
    """All segments, non-streaming; returns the concatenated float32 audio."""
    return np.concatenate(list(_run(scheduler, requests, window, stream=False, on_segment=on_segment)) or
                          [np.zeros(0, dtype=np.float32)])


def stream_segments(scheduler: Scheduler, requests: Sequence[SynthesisRequest], window: int = 2,
                    on_segment: Callable[[int], None] | None = None) -> Iterator[np.ndarray]:
    """Audio chunks of every segment in order, as soon as each is ready."""
    return _run(scheduler, requests, window, stream=True, on_segment=on_segment)


def _run(scheduler: Scheduler, requests: Sequence[SynthesisRequest], window: int, stream: bool,
         on_segment: Callable[[int], None] | None) -> Iterator[np.ndarray]:
    pending = collections.deque(requests)
    running: collections.deque[StreamHandle] = collections.deque()
    done = 0
    try:
        while pending or running:
            while pending and len(running) < max(1, window):
                running.append(scheduler.submit(pending.popleft(), stream=stream))
            yield from running.popleft()
            done += 1
            if on_segment is not None:
                on_segment(done)
    finally:
        for handle in running:  # consumer stopped early: free what is still in flight
            handle.cancel()
