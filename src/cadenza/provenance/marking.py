"""How a loaded model marks what it says (``OutputMark``): every output of the API and the server carries the
provenance watermark (docs/provenance.md) unless the operator turned it off when loading the model -- a request
cannot.

The payload is ``payload_hash(service, model id)``: the same for every output of one model, so the same seed still
gives the same audio, and a file found later says which service and model made it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from cadenza.errors import InputError
from cadenza.provenance.keys import DEFAULT_KEY
from cadenza.provenance.payload import payload_hash
from cadenza.provenance.watermark import StreamEmbedder, Watermark

DEFAULT_SERVICE = "cadenza"


@dataclass(frozen=True)
class OutputMark:
    """``watermark`` None: outputs are not marked."""

    watermark: Watermark | None
    payload: int = 0

    @classmethod
    def for_model(cls, sample_rate: int, model_id: str, watermark: bool | bytes | Watermark = True,
                  service: str = DEFAULT_SERVICE) -> OutputMark:
        """``watermark``: True (Cadenza's public key), False (off), an operator's key (bytes, e.g. from
        ``keys.load_key``) or a ``Watermark`` (at ``sample_rate``)."""
        if watermark is False:
            return cls(None)
        if watermark is True:
            watermark = Watermark(DEFAULT_KEY, int(sample_rate))
        elif isinstance(watermark, (bytes, bytearray)):
            watermark = Watermark(bytes(watermark), int(sample_rate))
        if not isinstance(watermark, Watermark):
            raise InputError(f"watermark is True, False, key bytes or a cadenza.provenance.Watermark, not "
                             f"{type(watermark).__name__}")
        if watermark.sample_rate != int(sample_rate):
            raise InputError(f"the watermark is set up for {watermark.sample_rate} Hz; this model speaks at "
                             f"{sample_rate} Hz")
        return cls(watermark, payload_hash(service, model_id))

    @property
    def enabled(self) -> bool:
        return self.watermark is not None

    def embedder(self) -> StreamEmbedder | None:
        """A fresh embedder for one output (None when off): ``push`` every chunk of it, in order."""
        return None if self.watermark is None else self.watermark.embedder(self.payload)

    def whole(self, audio: np.ndarray) -> np.ndarray:
        if self.watermark is None or audio.size == 0:
            return audio
        return self.watermark.embed(audio, self.payload)

    def stream(self, chunks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        """``chunks`` marked as they come (the same samples as ``whole`` of them all); closing this closes
        ``chunks`` (which cancels the request behind them)."""
        embedder = self.embedder()
        if embedder is None:
            yield from chunks
            return
        try:
            for chunk in chunks:
                yield embedder.push(chunk)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
