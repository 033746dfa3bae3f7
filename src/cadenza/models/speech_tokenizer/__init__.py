"""Supervised FSQ speech tokenizer (CosyVoice 2 design): whisper log-mel -> 25 Hz ids in ``[0, (2K + 1)^D)``.

Inference only (no training imports); training lives in ``cadenza.training.speech_tokenizer_stage``.
"""

from cadenza.models.speech_tokenizer.char_vocab import CharVocab
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
from cadenza.models.speech_tokenizer.inference import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    SpeechTokenizer,
    find_speech_tokenizer,
    load_speech_tokenizer,
    save_speech_tokenizer,
)
from cadenza.models.speech_tokenizer.model import SpeechTokenizerModel, SupervisedSpeechTokenizer

__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "CharVocab",
    "SpeechTokenizer",
    "SpeechTokenizerConfig",
    "SpeechTokenizerModel",
    "SupervisedSpeechTokenizer",
    "find_speech_tokenizer",
    "load_speech_tokenizer",
    "save_speech_tokenizer",
]
