"""Text that arrives piece by piece (an upstream LLM, a WebSocket client), spoken as it comes: two ways.

* ``TokenTextStream``: the pieces are tokenized as they arrive and fed to one bi-streaming request, whose LM
  interleaves text and speech tokens (CosyVoice 2): audio starts a few words in.
* ``SentenceTextStream``: each sentence becomes its own segment request once it is complete (``complete_prefix``),
  spoken in order through the one long-form implementation (``SegmentStream``): for models that read a whole text
  before speaking it (VoxCPM 2). Audio starts after the first sentence.

Both offer ``feed(text)``, ``end()``, ``fail(exc)``, iteration for float32 chunks and ``cancel()``
(``cadenza.api.protocol.TextStream``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import torch

from cadenza.engine.long_form import SegmentStream, Submit
from cadenza.engine.stream_handle import StreamHandle
from cadenza.text.segment import complete_prefix

# A sentence-less run of text longer than this is cut at its last space (or here) rather than waiting for an end.
MAX_PENDING_CHARS = 400


class TokenTextStream:
    """Pieces -> token ids (``encoder.feed``/``flush``) -> a bi-streaming request's ``handle``."""

    def __init__(self, handle: StreamHandle, encoder) -> None:
        self._handle, self._encoder = handle, encoder
        self._lock = threading.Lock()  # the encoder keeps state between pieces

    def feed(self, text: str) -> None:
        with self._lock:
            ids = self._encoder.feed(text)
        if ids:
            self._handle.feed_text(torch.tensor([ids], dtype=torch.long))

    def end(self) -> None:
        with self._lock:
            ids = self._encoder.flush()
        if ids:
            self._handle.feed_text(torch.tensor([ids], dtype=torch.long))
        self._handle.end_text()

    def fail(self, exc: BaseException) -> None:
        self._handle.fail(exc)

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self._handle)

    def cancel(self) -> None:
        self._handle.cancel()


class SentenceTextStream:
    """Pieces -> complete sentences -> ``make_requests(text, index)`` (the requests of that text; ``index`` counts
    the texts made so far, e.g. to vary seeds; ``[]`` when it has nothing to speak) -> spoken in order.

    ``feed`` raises what ``make_requests`` raises (bad text is the writer's error, not the reader's)."""

    def __init__(self, submit: Submit, make_requests: Callable[[str, int], list], window: int = 1) -> None:
        self._make = make_requests
        self._segments = SegmentStream(submit, [], window, stream=True, open_ended=True)
        self._buffer = ""
        self._count = 0
        self._lock = threading.Lock()

    def _take(self, text: str) -> None:
        requests = self._make(text, self._count)
        self._count += 1
        if requests:
            self._segments.add(requests)

    def feed(self, text: str) -> None:
        with self._lock:
            self._buffer += text
            cut = complete_prefix(self._buffer)
            if not cut and len(self._buffer) > MAX_PENDING_CHARS:
                space = self._buffer.rfind(" ", 0, MAX_PENDING_CHARS)
                cut = space if space > 0 else MAX_PENDING_CHARS
            if cut:
                head, self._buffer = self._buffer[:cut], self._buffer[cut:]
                self._take(head)

    def end(self) -> None:
        with self._lock:
            rest, self._buffer = self._buffer, ""
            try:
                if rest.strip():
                    self._take(rest)
            finally:
                self._segments.end()

    def fail(self, exc: BaseException) -> None:
        self._segments.fail(exc)

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._segments

    def cancel(self) -> None:
        self._segments.cancel()
