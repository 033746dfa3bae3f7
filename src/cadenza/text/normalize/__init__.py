"""Text normalisation for English and Chinese TTS: numbers, money, dates, times, units, abbreviations -> words.

Pure Python, offline, no grammar toolkits. ``normalize(text, lang=None)`` is pure and idempotent; see
``docs/text.md`` for the covered categories, the language rule and the protected tags.
"""

from cadenza.text.normalize.core import normalize
from cadenza.text.normalize.detect import detect_language
from cadenza.text.normalize.tags import protected_spans, split_protected

__all__ = ["detect_language", "normalize", "protected_spans", "split_protected"]
