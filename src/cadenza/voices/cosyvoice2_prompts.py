"""Saved voices as CosyVoice 2 prompts (``SpeakerPrompt``: prompt speech tokens, mel, x-vector, transcript ids).

A voice with a transcript clones zero-shot (the transcript conditions the LM); one without, cross-lingually (voice
only). Speakers of the model's ``spk2info.pt`` resolve too, after the store's voices.
"""

from __future__ import annotations

import numpy as np

from cadenza.models.cosyvoice2.speakers import SpeakerPrompt, entry_to_prompt
from cadenza.voices.cache_key import cosyvoice2_frontend_files, prompt_cache_key
from cadenza.voices.prompts import PromptLibrary
from cadenza.voices.records import VoiceRecord


class CosyVoice2Prompts(PromptLibrary):
    """``tts``: a ``cadenza.api.Cadenza``."""

    family = "cosyvoice2"

    def _model_key(self) -> str:
        files = getattr(self.tts.engine.frontend, "files", None)
        return prompt_cache_key(cosyvoice2_frontend_files(files)) if files is not None else "cv2-nofiles"

    def _compute(self, samples: np.ndarray, sample_rate: int, transcript: str | None,
                 cloning: str | None) -> SpeakerPrompt:
        return self.tts.voice_from_audio((samples, sample_rate), transcript)

    def _to_entry(self, prompt: SpeakerPrompt) -> dict:
        return prompt.to_entry()

    def _from_entry(self, label: str, entry: dict) -> SpeakerPrompt:
        return entry_to_prompt(label, entry)

    def _mode(self, record: VoiceRecord) -> str:
        return "zero_shot" if record.transcript is not None else "cross_lingual"

    def _forget_derived(self, prompt: SpeakerPrompt) -> None:
        self.tts.engine.scheduler.forget_prompt(prompt)  # its primed flow state

    def model_speaker(self, ref: str) -> SpeakerPrompt | None:
        speakers = self.tts.engine.speakers
        return speakers.get(ref) if isinstance(ref, str) and ref in speakers else None

    def model_speaker_ids(self) -> list[str]:
        return self.tts.engine.speakers.ids()
