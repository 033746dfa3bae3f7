"""Checks on everything a saved voice holds: its id, name, transcript, consent statement and prompt audio.

Ids are the only strings that ever become path components (the prompt cache), so they have a strict format that we
generate ourselves; names are free-form labels that live in the database only.
"""

from __future__ import annotations

import io
import re
import unicodedata

import numpy as np
import torch

from cadenza.audio.io import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, decode_audio, save_wav
from cadenza.audio.prompt import DEFAULT_MAX_SECONDS, DEFAULT_MIN_SECONDS, mono_samples, validate_prompt_audio
from cadenza.errors import AudioError, InputError, UnknownSpeakerError

ID_PREFIX = "voice_"
ID_TOKEN_BYTES = 16  # secrets.token_urlsafe(16) -> 22 URL-safe characters
_ID = re.compile(rf"^{ID_PREFIX}[A-Za-z0-9_-]{{22}}$")
# Letters (any script), digits, '_', space, '.', '-'; no leading/trailing space (invisible duplicates).
_NAME = re.compile(r"^[\w.\- ]{1,64}$")
_MODEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_TRANSCRIPT_CHARS = 2000
MAX_CONSENT_CHARS = 4000
# Stored prompts keep their own rate up to 48 kHz: every model we load resamples from there, and higher rates only
# make the stored WAV bigger (30 s at 48 kHz, 16 bit, mono = 2.9 MB).
MAX_STORED_RATE = 48_000
DEFAULT_MAX_AUDIO_BYTES = 20 * 2**20

PromptInput = bytes | bytearray | memoryview | tuple[np.ndarray | torch.Tensor, int]


def validate_voice_id(voice_id: str) -> str:
    """A voice id as this store generates it (``voice_`` + 22 URL-safe characters); anything else is refused."""
    if not isinstance(voice_id, str) or not _ID.match(voice_id):
        raise UnknownSpeakerError(f"invalid voice id {str(voice_id)[:80]!r}: ids look like '{ID_PREFIX}' + 22 "
                                  "letters, digits, '_' or '-'")
    return voice_id


def looks_like_id(value: str) -> bool:
    return isinstance(value, str) and bool(_ID.match(value))


def validate_voice_name(name: str) -> str:
    """Returns the name in Unicode NFC (so the same name typed on different systems is one name)."""
    if isinstance(name, str):
        name = unicodedata.normalize("NFC", name)
    # At least one letter or digit: names of only dots/dashes ('..') read like paths even though they never are.
    if (not isinstance(name, str) or not _NAME.match(name) or name != name.strip()
            or not re.search(r"[^\W_]", name)):
        raise InputError(f"invalid voice name {str(name)[:80]!r}: use 1-64 letters, digits, spaces, '.', '_' or '-' "
                         "with at least one letter or digit and no leading or trailing space")
    if looks_like_id(name):
        raise InputError(f"invalid voice name {name!r}: it has the form of a voice id")
    return name


def validate_model_key(key: str) -> str:
    if not isinstance(key, str) or not _MODEL_KEY.match(key) or ".." in key:
        raise InputError(f"invalid prompt-cache model key {str(key)[:80]!r}")
    return key


def _check_text(value: str, what: str, limit: int) -> str:
    if not isinstance(value, str):
        raise InputError(f"{what} must be a string, not {type(value).__name__}")
    if not value.strip():
        raise InputError(f"{what} is empty")
    if len(value) > limit:
        raise InputError(f"{what} is {len(value)} characters; at most {limit}")
    if "\x00" in value:
        raise InputError(f"{what} contains a NUL character")
    return value


def validate_transcript(transcript: str | None) -> str | None:
    """``None`` (no transcript: the voice is used cross-lingually) or non-empty text, kept verbatim."""
    return None if transcript is None else _check_text(transcript, "transcript", MAX_TRANSCRIPT_CHARS)


def validate_consent(consent: str) -> str:
    """The speaker's consent statement: required, kept verbatim (an audit record, not something we rewrite)."""
    if consent is None:
        raise InputError("a consent statement is required to save a voice (the speaker's permission to clone it)")
    return _check_text(consent, "consent statement", MAX_CONSENT_CHARS)


def validate_declared_by(declared_by: str | None) -> str | None:
    """Who declares the right to use a voice (a person or organisation, as they name themselves): optional text."""
    return None if declared_by is None else _check_text(declared_by, "declared_by", 200)


def _from_array(samples: np.ndarray | torch.Tensor, sr: int) -> tuple[torch.Tensor, int]:
    wav = mono_samples(torch.as_tensor(np.asarray(samples, dtype=np.float32)))
    if isinstance(sr, bool) or not isinstance(sr, (int, np.integer)) or not MIN_SAMPLE_RATE <= sr <= MAX_SAMPLE_RATE:
        raise AudioError(f"sample rate must be an integer in {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz, got {sr!r}")
    return wav, int(sr)


def decode_prompt(audio: PromptInput, max_bytes: int = DEFAULT_MAX_AUDIO_BYTES,
                  min_seconds: float = DEFAULT_MIN_SECONDS, max_seconds: float = DEFAULT_MAX_SECONDS,
                  what: str = "prompt audio", shorten: str = "trim it to one or two sentences",
                  ) -> tuple[torch.Tensor, int]:
    """Encoded audio bytes or ``(samples, sample_rate)`` -> validated mono float32 ``[N]`` at <= 48 kHz, rate.

    Encoded audio is never decoded past ``max_seconds`` (``decode_audio`` checks the header, then stops decoding at
    the limit), so a small file that expands to hours of audio is refused at the cost of ``max_seconds`` of audio.
    Raises ``AudioError`` for anything ``decode_audio``/``validate_prompt_audio`` reject (undecodable, too big,
    too short or long, silent, NaN); ``what`` and ``shorten`` word them (``validate_prompt_audio``).
    """
    if isinstance(audio, tuple):
        if len(audio) != 2:
            raise AudioError("prompt audio as a tuple must be (samples, sample_rate)")
        wav, sr = _from_array(*audio)
    elif isinstance(audio, (bytes, bytearray, memoryview)):  # at its own rate, any format decode_audio reads
        wav, sr = _from_array(*decode_audio(bytes(audio), max_bytes, max_seconds=max_seconds))
    else:
        raise AudioError(f"prompt audio must be encoded bytes or (samples, sample_rate), not {type(audio).__name__}")
    if sr > MAX_STORED_RATE:
        from cadenza.audio.resample import resample

        wav, sr = resample(wav, sr, MAX_STORED_RATE), MAX_STORED_RATE
    validate_prompt_audio(wav, sr, min_seconds=min_seconds, max_seconds=max_seconds, what=what, shorten=shorten)
    return wav, sr


def wav_bytes(wav: torch.Tensor, sr: int) -> bytes:
    """Mono float ``[N]`` -> 16-bit PCM WAV file bytes (``save_wav``)."""
    buf = io.BytesIO()
    save_wav(buf, wav, sr)
    return buf.getvalue()
