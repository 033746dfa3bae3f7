"""Word timestamps: where each input word is spoken in synthesised audio (docs/controls.md, "Word timestamps")."""

from cadenza.alignment.aligner import WordTiming
from cadenza.alignment.timer import WordTimer, align_words

__all__ = ["WordTiming", "WordTimer", "align_words"]
