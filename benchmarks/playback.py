"""What a player reading a stream's chunks in order hears: when the first audio came and how long it waited later."""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np


def play(chunks: Iterable[np.ndarray], sample_rate: int) -> tuple[float, float]:
    """(first chunk s, stall s) of ``chunks`` (the iterator is started here, so its set-up counts). A stall is time a
    player would have waited: a chunk arriving after the audio before it had played out."""
    start = time.perf_counter()
    first = played = None
    stall = 0.0
    for chunk in chunks:
        now = time.perf_counter() - start
        if first is None:
            first = played = now
        else:
            stall += max(0.0, now - played)
            played = max(played, now)
        played += len(chunk) / sample_rate
    return first, stall
