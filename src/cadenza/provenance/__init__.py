"""Provenance: an inaudible keyed watermark with a payload in Cadenza's output, and its detector
(docs/provenance.md)."""

from cadenza.provenance.payload import payload_hash
from cadenza.provenance.watermark import Detection, StreamEmbedder, Watermark

__all__ = ["Detection", "StreamEmbedder", "Watermark", "payload_hash"]
