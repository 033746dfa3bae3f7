"""Saved voices: a persistent, process-safe store of prompt recordings with their transcript and consent."""

from cadenza.voices.cache_key import cosyvoice2_frontend_files, prompt_cache_key
from cadenza.voices.records import VoiceRecord
from cadenza.voices.store import VoiceStore, open_voices
from cadenza.voices.validation import validate_voice_id, validate_voice_name

__all__ = ["VoiceRecord", "VoiceStore", "open_voices", "cosyvoice2_frontend_files", "prompt_cache_key", "validate_voice_id",
           "validate_voice_name"]
