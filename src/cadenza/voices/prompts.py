"""Saved voices -> the model's prompt features, and requests built on them (used by the API, CLI and server).

Resolution order: a voice in the ``VoiceStore`` (by id, else by name), then a speaker saved in the model's
``spk2info.pt``. A store voice's prompt features are computed once per model from its stored audio + transcript
(``Cadenza.voice_from_audio``) and cached twice: in memory (LRU, by voice id) and on disk through
``VoiceStore.cache_prompt`` under a key that fingerprints the model's frontend files.

The requests are built the way ``Cadenza.request`` builds them for ``prompt_wav`` + ``prompt_text`` (zero-shot), a
``prompt_wav`` alone (cross-lingual), ``speaker`` and ``instruct`` -- but from the ready ``SpeakerPrompt``, which
``Cadenza.request`` does not accept yet (and it refuses ``instruct`` together with a transcript, which a saved voice
always brings along).
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass

import torch

from cadenza.engine.request import SynthesisRequest
from cadenza.errors import UnknownSpeakerError
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt, entry_to_prompt
from cadenza.voices import VoiceRecord, VoiceStore, cosyvoice2_frontend_files, prompt_cache_key
from cadenza.voices.store import stored_samples
from cadenza.voices.validation import PromptInput, decode_prompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Voice:
    """A resolved voice: the prompt features, and whether it brings a transcript (zero-shot) or not."""

    prompt: SpeakerPrompt
    label: str  # for logs and errors: the store id or the spk2info speaker id
    mode: str  # "zero_shot", "cross_lingual" or "speaker"


class VoicePrompts:
    def __init__(self, tts, store: VoiceStore, cache_size: int = 64) -> None:
        self.tts, self.store = tts, store
        files = getattr(tts.engine.frontend, "files", None)
        self.model_key = prompt_cache_key(cosyvoice2_frontend_files(files)) if files is not None else "cv2-nofiles"
        self._memory: collections.OrderedDict[str, SpeakerPrompt] = collections.OrderedDict()
        self._size = cache_size
        self._lock = threading.Lock()

    # -- voices --------------------------------------------------------------------------------------------------
    def lookup(self, ref: str, reveal_names: bool = False) -> VoiceRecord | str:
        """The store's record for ``ref``, else the name of a ``spk2info.pt`` speaker; no feature work. Raises
        ``UnknownSpeakerError``; its message lists the saved voices only with ``reveal_names`` (the Python API's
        user owns them all; a server's clients must not learn each other's voice names)."""
        try:
            return self.store.get(ref)
        except UnknownSpeakerError:
            speakers = self.tts.engine.speakers
            if isinstance(ref, str) and ref in speakers:
                return ref
            if reveal_names:
                saved = [r.name for r in self.store.list()[:20]] + speakers.ids()[:20]
                hint = f" (available: {', '.join(saved) or 'none yet'})"
            else:
                hint = f"; the model's own speakers: {', '.join(speakers.ids()[:20])}" if speakers.ids() else ""
            raise UnknownSpeakerError(
                f"unknown voice {str(ref)[:80]!r}: create one with POST /v1/audio/voices{hint}"
            ) from None

    def resolve(self, ref: str, reveal_names: bool = True) -> Voice:
        """Blocking (may compute features): call it off the event loop. Raises ``UnknownSpeakerError``."""
        found = self.lookup(ref, reveal_names)
        if isinstance(found, str):
            return Voice(self.tts.engine.speakers.get(found), found, "speaker")
        prompt = self.prompt(found)
        return Voice(prompt, found.id, "zero_shot" if found.transcript is not None else "cross_lingual")

    def create(self, name: str, audio: PromptInput, transcript: str | None, consent: str,
               max_seconds: float | None = None) -> VoiceRecord:
        """Validate, compute the prompt features, then save the voice in one transaction (and cache the features).

        Nothing is written unless the model can use the voice (a transcript with nothing to speak, audio the model
        refuses): a crash or an error at any point leaves no voice behind that the caller was not told about.
        """
        max_seconds = self.store.max_seconds if max_seconds is None else max_seconds
        name, transcript, consent = self.store.check_new(name, transcript, consent)
        wav, sr = decode_prompt(audio, self.store.max_audio_bytes, max_seconds=max_seconds)
        # The features of exactly what the store will give back (16-bit), as a later recomputation would make them.
        prompt = self.tts.voice_from_audio((stored_samples(wav).numpy(), sr), transcript)
        record = self.store.add(name, (wav.numpy(), sr), transcript, consent)
        try:
            self.store.cache_prompt(record.id, self.model_key, prompt.to_entry())
        except (OSError, UnknownSpeakerError) as exc:  # the voice is usable: its features are recomputed on use
            log.warning("voice %s saved, but its prompt features were not cached: %s", record.id, exc)
        self._remember(record.id, prompt)
        return record

    def prompt(self, record: VoiceRecord) -> SpeakerPrompt:
        with self._lock:
            if record.id in self._memory:
                self._memory.move_to_end(record.id)
                return self._memory[record.id]
        cached = self.store.cached_prompt(record.id, self.model_key)
        if cached is not None:
            prompt = entry_to_prompt(record.id, cached)
        else:
            prompt = self.compute(record)
            try:
                self.store.cache_prompt(record.id, self.model_key, prompt.to_entry())
            except UnknownSpeakerError:  # deleted meanwhile; this request still gets its voice
                pass
        self._remember(record.id, prompt)
        return prompt

    def compute(self, record: VoiceRecord) -> SpeakerPrompt:
        samples, sr = self.store.audio(record.id)
        return self.tts.voice_from_audio((samples, sr), record.transcript)

    def _remember(self, voice_id: str, prompt: SpeakerPrompt) -> None:
        with self._lock:
            self._memory[voice_id] = prompt
            self._memory.move_to_end(voice_id)
            while len(self._memory) > self._size:
                self._memory.popitem(last=False)

    def forget(self, voice_id: str) -> None:
        with self._lock:
            self._memory.pop(voice_id, None)

    # -- requests ------------------------------------------------------------------------------------------------
    def _conditioning(self, voice: Voice, instructions: str | None):
        """(voice prompt, mode, LM prompt text, LM prompt speech) as ``Cadenza._voice`` resolves them."""
        eng = self.tts.engine
        if voice.mode == "cross_lingual":
            prompt, mode, lm_text, lm_speech = voice.prompt, "cross_lingual", voice.prompt.prompt_text, None
        else:
            prompt, mode = voice.prompt, voice.mode
            lm_text, lm_speech = voice.prompt.prompt_text, voice.prompt.llm_prompt_speech
        if instructions is not None:
            mode, lm_text, lm_speech = "instruct2", eng.frontend.instruct_ids(instructions), None
        return prompt, mode, lm_text, lm_speech

    def build(self, text_ids: torch.Tensor, voice: Voice, instructions: str | None = None,
              seed: int | None = None, speed: float = 1.0) -> SynthesisRequest:
        prompt, mode, lm_text, lm_speech = self._conditioning(voice, instructions)
        return self.tts.engine.build(text_ids=text_ids, voice=prompt, mode=mode, lm_prompt_text=lm_text,
                                     lm_prompt_speech=lm_speech, seed=seed, speed=speed)

    def build_bistream(self, voice: Voice, instructions: str | None = None,
                       seed: int | None = None) -> SynthesisRequest:
        prompt, mode, lm_text, lm_speech = self._conditioning(voice, instructions)
        return self.tts.engine.build_bistream(voice=prompt, mode=mode, lm_prompt_text=lm_text,
                                              lm_prompt_speech=lm_speech, seed=seed)
