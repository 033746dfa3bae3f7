"""Text front end: tokenizers, normalisation (``normalize``) and long-text segmentation (``split_text``).

Importing this package loads only the standard library and ``re``-based modules (no torch, no tokenizers).
"""

from cadenza.text.normalize import normalize
from cadenza.text.segment import estimate_tokens, split_text

__all__ = ["estimate_tokens", "normalize", "split_text"]
