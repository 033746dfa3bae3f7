"""``stream_planned``: a text's later segments planned in the reader's thread as the audio goes, a batch at a time
when few are left to submit; errors of a later batch reach the reader after the audio before them; closing stops
the planning."""

from __future__ import annotations

import numpy as np
import pytest

from cadenza.engine.long_form import stream_planned
from cadenza.errors import TextError


class _Handle:
    def __init__(self, index: int, chunks: int = 2) -> None:
        self.index, self.chunks, self.cancelled = index, chunks, False

    def __iter__(self):
        for _ in range(self.chunks):
            yield np.full(3, self.index, dtype=np.float32)

    def cancel(self) -> None:
        self.cancelled = True


def _submit(log: list):
    def submit(request, stream):
        assert stream is True
        log.append(request)
        return _Handle(request)
    return submit


def _batches(asked: list, batches: list, fail_at: int | None = None):
    for i, batch in enumerate(batches):
        asked.append(i)
        if i == fail_at:
            raise TextError(f"block {i} has another script")
        yield batch


def test_every_segment_in_order_and_later_batches_only_when_needed():
    submitted, asked = [], []
    later = _batches(asked, [[3, 4, 5, 6], [], [7], [8, 9]])
    stream = stream_planned(_submit(submitted), [0, 1, 2, 10, 11], later, low_water=3)
    first = next(stream)
    assert first[0] == 0 and asked == []  # five segments wait: nothing more planned before the first audio
    chunks = [first, *stream]
    assert [int(c[0]) for c in chunks[::2]] == [0, 1, 2, 10, 11, 3, 4, 5, 6, 7, 8, 9]
    assert asked == [0, 1, 2, 3] and submitted == [0, 1, 2, 10, 11, 3, 4, 5, 6, 7, 8, 9]


def test_a_later_batch_that_fails_raises_after_the_audio_before_it():
    asked = []
    stream = stream_planned(_submit([]), [0], _batches(asked, [[1], [2]], fail_at=1), low_water=1)
    got = []
    with pytest.raises(TextError, match="block 1"):
        for chunk in stream:
            got.append(int(chunk[0]))
    assert got == [0, 0, 1, 1]


def test_closing_the_stream_stops_the_planning():
    asked = []
    stream = stream_planned(_submit([]), [0, 1, 2], _batches(asked, [[k] for k in range(3, 100)]), low_water=2)
    next(stream)
    stream.close()
    assert len(asked) <= 2
