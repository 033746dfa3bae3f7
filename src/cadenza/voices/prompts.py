"""Saved voices -> a model's prompt features (``PromptLibrary``; one subclass per model family).

Resolution order: a voice in the ``VoiceStore`` (by id, else by name), then a speaker the model ships (CosyVoice 2's
``spk2info.pt``). A store voice is made for one model family (``VoiceRecord.family``); asking another family to
speak with it is a ``VoiceFamilyError`` naming both, since the voice was checked (and its cloning mode chosen) for
the family it was made for. Its prompt features are computed once per model from its stored audio + transcript and
cached twice: in memory (LRU, by voice id) and in the store through ``VoiceStore.cache_prompt`` under a key that
fingerprints the model files the features depend on (``model_key``).

The memory never answers for the store: every lookup reads the voice's record from the store first, so a voice
another process or replica deleted is unknown here at once. What memory still holds of such a voice (its prompt, a
primed flow) is dropped by the next lookup after ``forget_check_s`` seconds, which asks the store which remembered
voices still exist.

Subclasses (``cosyvoice2_prompts.py``, ``voxcpm2_prompts.py``) say how to compute a prompt from audio, how to store
it as tensors, and which cloning modes their voices may have.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from cadenza.errors import CadenzaError, InputError, UnknownSpeakerError, VoiceFamilyError
from cadenza.voices.records import VoiceRecord, stored_samples
from cadenza.voices.store import VoiceStore
from cadenza.voices.validation import PromptInput, decode_prompt

log = logging.getLogger(__name__)

FAMILY_TITLES = {"cosyvoice2": "CosyVoice 2", "voxcpm2": "VoxCPM 2"}


@dataclass(frozen=True)
class Voice:
    """A resolved voice: the family's prompt object and how it is used.

    ``mode``: CosyVoice 2 ``"zero_shot"`` (with transcript), ``"cross_lingual"`` or ``"speaker"`` (spk2info.pt);
    VoxCPM 2 ``"reference"``, ``"continuation"`` or ``"combined"``.
    """

    prompt: object
    label: str  # for logs and errors: the store id or the model's own speaker id
    mode: str


class PromptLibrary:
    """The voices of ``store`` as prompts of the model ``tts`` (thread-safe)."""

    family = ""  # the ``VoiceRecord.family`` this library serves
    cloning_modes: tuple[str, ...] = ()  # what a voice's ``cloning`` may be for this family (empty: not used)
    forget_check_s = 5.0  # how often lookups drop remembered voices that were deleted elsewhere

    def __init__(self, tts, store: VoiceStore, cache_size: int = 64) -> None:
        self.tts, self.store = tts, store
        self.model_key = self._model_key()
        self._memory: collections.OrderedDict[str, object] = collections.OrderedDict()
        self._size = cache_size
        self._lock = threading.Lock()
        self._checked = time.monotonic()

    # -- what a family says ----------------------------------------------------------------------------------------
    def _model_key(self) -> str:
        raise NotImplementedError

    def _compute(self, samples: np.ndarray, sample_rate: int, transcript: str | None, cloning: str | None):
        """The prompt of this audio (mono float32) for this model (blocking; may raise ``AudioError``/``TextError``)."""
        raise NotImplementedError

    def _to_entry(self, prompt) -> dict:
        raise NotImplementedError

    def _from_entry(self, label: str, entry: dict):
        raise NotImplementedError

    def _mode(self, record: VoiceRecord) -> str:
        raise NotImplementedError

    def check_cloning(self, transcript: str | None, cloning: str | None) -> str | None:
        """The cloning mode a new voice gets (``None`` when the family has none); ``InputError`` when unusable."""
        if cloning is not None:
            raise InputError(f"{self.title} voices have no cloning mode (the transcript decides how a voice is "
                             "used): leave 'cloning' out")
        return None

    def model_speaker(self, ref: str):
        """A prompt the model itself ships under the name ``ref``, else None."""
        return None

    def model_speaker_ids(self) -> list[str]:
        return []

    @property
    def title(self) -> str:
        return FAMILY_TITLES.get(self.family, self.family)

    # -- voices ----------------------------------------------------------------------------------------------------
    def lookup(self, ref: str, reveal_names: bool = False) -> VoiceRecord | str:
        """The store's record for ``ref``, else the name of a speaker the model ships; no feature work. Raises
        ``UnknownSpeakerError`` (its message lists the saved voices only with ``reveal_names``: the Python API's user
        owns them all; a server's clients must not learn each other's voice names) or ``VoiceFamilyError``."""
        self._forget_deleted()
        try:
            record = self.store.get(ref)
        except UnknownSpeakerError:
            if isinstance(ref, str) and self.model_speaker(ref) is not None:
                return ref
            own = self.model_speaker_ids()
            if reveal_names:
                saved = [r.name for r in self.store.list()[:20] if r.family == self.family] + own[:20]
                hint = f" (available: {', '.join(saved) or 'none yet'})"
            else:
                hint = f"; the model's own speakers: {', '.join(own[:20])}" if own else ""
            raise UnknownSpeakerError(
                f"unknown voice {str(ref)[:80]!r}: save one (`cadenza voices add`, POST /v1/audio/voices){hint}"
            ) from None
        if record.family != self.family:
            made_for = FAMILY_TITLES.get(record.family, record.family)
            raise VoiceFamilyError(
                f"voice {str(ref)[:80]!r} was made for {made_for} models and this is a {self.title} model: create "
                f"the voice again for it (`cadenza voices add --model`, or POST /v1/audio/voices with this model's "
                "name in 'model')")
        return record

    def resolve(self, ref: str, reveal_names: bool = True) -> Voice:
        """Blocking (may compute features): call it off the event loop. Raises ``UnknownSpeakerError``."""
        found = self.lookup(ref, reveal_names)
        if isinstance(found, str):
            return Voice(self.model_speaker(found), found, "speaker")
        voice = Voice(self.prompt(found), found.id, self._mode(found))
        try:
            self.store.record_use(found.id)  # the consent record's use count
        except Exception as exc:  # noqa: BLE001 - a busy or read-only store must not fail the synthesis
            log.warning("voice %s: use not counted: %s", found.id, exc)
        return voice

    def create(self, name: str, audio: PromptInput, transcript: str | None, consent: str,
               max_seconds: float | None = None, cloning: str | None = None,
               declared_by: str | None = None, keep_audio: bool = False,
               audio_ttl_s: float | None = None) -> VoiceRecord:
        """Validate, compute the prompt features, then save the voice and its features in one transaction.

        Nothing is written unless the model can use the voice (a transcript with nothing to speak, audio the model
        refuses): a crash or an error at any point leaves no voice behind that the caller was not told about.
        Retention: by default only what synthesis needs is kept (this model's features), not the recording;
        ``keep_audio`` keeps it too (``audio_ttl_s``: for that long), so the voice can be recomputed for other
        model files of the family.
        """
        max_seconds = self.store.max_seconds if max_seconds is None else max_seconds
        name, transcript, consent = self.store.check_new(name, transcript, consent)
        cloning = self.check_cloning(transcript, cloning)
        wav, sr = decode_prompt(audio, self.store.max_audio_bytes, max_seconds=max_seconds)
        # The features of exactly what the store will give back (16-bit), as a later recomputation would make them.
        prompt = self._compute(stored_samples(wav).numpy(), sr, transcript, cloning)
        record = self.store.add(name, (wav.numpy(), sr), transcript, consent, family=self.family, cloning=cloning,
                                declared_by=declared_by, keep_audio=keep_audio, audio_ttl_s=audio_ttl_s,
                                features={self.model_key: self._to_entry(prompt)})
        self._remember(record.id, prompt)
        return record

    def prompt(self, record: VoiceRecord):
        with self._lock:
            if record.id in self._memory:
                self._memory.move_to_end(record.id)
                return self._memory[record.id]
        cached = self.store.cached_prompt(record.id, self.model_key)
        prompt = None
        if cached is not None:
            try:
                prompt = self._from_entry(record.id, cached)
            except (InputError, KeyError, ValueError) as exc:  # an older layout: recompute
                log.warning("voice %s: cached prompt unusable (%s); recomputing", record.id, exc)
        if prompt is None:
            prompt = self.compute(record)
            try:
                self.store.cache_prompt(record.id, self.model_key, self._to_entry(prompt))
            except UnknownSpeakerError:  # deleted meanwhile; this request still gets its voice
                pass
        self._remember(record.id, prompt)
        return prompt

    def compute(self, record: VoiceRecord):
        if not record.audio_kept:  # (dropped since the record was read: store.audio says so)
            raise VoiceFamilyError(
                f"voice {record.name[:80]!r} was saved without its recording, with the features of other model files "
                f"of {self.title} than this model's: create the voice again for this model")
        samples, sr = self.store.audio(record.id)
        return self._compute(samples, sr, record.transcript, record.cloning)

    def _remember(self, voice_id: str, prompt) -> None:
        with self._lock:
            self._memory[voice_id] = prompt
            self._memory.move_to_end(voice_id)
            while len(self._memory) > self._size:
                self._memory.popitem(last=False)

    def _forget_deleted(self) -> None:
        """Drop what memory holds of voices deleted by another process or replica (at most every
        ``forget_check_s``; one query for all remembered ids)."""
        now = time.monotonic()
        with self._lock:
            if not self._memory or now - self._checked < self.forget_check_s:
                return
            self._checked = now
            remembered = list(self._memory)
        try:
            alive = self.store.existing(remembered)
        except CadenzaError as exc:  # the store is unreachable: the lookup that follows says so; check later
            log.debug("not checking remembered voices now: %s", exc)
            return
        for voice_id in remembered:
            if voice_id not in alive:
                self.forget(voice_id)

    def forget(self, voice_id: str) -> None:
        """Drop what the model keeps of a (deleted) voice: the remembered prompt and any state derived from it."""
        with self._lock:
            prompt = self._memory.pop(voice_id, None)
        if prompt is not None:
            self._forget_derived(prompt)

    def _forget_derived(self, prompt) -> None:
        """Free state the model derived from ``prompt`` (e.g. a primed flow); nothing by default."""
