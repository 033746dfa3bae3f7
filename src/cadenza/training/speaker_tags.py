"""Multi-speaker fine-tuning tags (mSFT; docs/training.md, "Stage lm"): ``Speaker A<|endofprompt|>`` before the text.

Each training text gets the tag of its speaker, or ``unknown<|endofprompt|>`` when the speaker is not labelled (or,
with ``unknown_probability``, at random so that the untagged style stays available). At inference the same prefix
is given as instruct text (``instruct="Speaker A"``, which the frontend ends with ``<|endofprompt|>``).
"""

from __future__ import annotations

from collections.abc import Mapping

from cadenza.errors import InputError
from cadenza.text.phonemes import PhonemeTokenizer
from cadenza.text.qwen_tokenizer import ENDOFPROMPT


class SpeakerTagger:
    def __init__(self, tokenizer, names: Mapping[str, str] | None = None, unknown: str = "unknown",
                 unknown_probability: float = 0.0) -> None:
        if tokenizer is None:
            raise InputError("speaker tags need the text tokenizer: give model.tokenizer (a CosyVoice-BlankEN folder) "
                             "or model.dir with CosyVoice-BlankEN/vocab.json + merges.txt")
        if isinstance(tokenizer, PhonemeTokenizer):
            raise InputError("speaker tags (lm.speaker_tags) need a BPE text tokenizer with <|endofprompt|>; this "
                             "model reads phonemes: train without speaker_tags")
        if not 0 <= unknown_probability <= 1:
            raise InputError("lm.unknown_speaker_probability must be in [0, 1]")
        self.tokenizer = tokenizer
        self.names = dict(names or {})
        self.unknown = unknown
        self.unknown_probability = unknown_probability
        self._cache: dict[str, list[int]] = {}

    def tag(self, speaker: str) -> str:
        """The tag name of a corpus speaker id (the mapped name, the id itself, or ``unknown``)."""
        if not speaker:
            return self.unknown
        if self.names:
            return self.names.get(speaker, self.unknown)
        return speaker

    def ids(self, speaker: str, draw: float) -> list[int]:
        """Token ids of ``<tag><|endofprompt|>`` (``draw`` ~ U[0, 1) decides the random ``unknown``)."""
        name = self.unknown if draw < self.unknown_probability else self.tag(speaker)
        if name not in self._cache:
            self._cache[name] = list(self.tokenizer.encode(f"{name}{ENDOFPROMPT}"))
        return self._cache[name]
