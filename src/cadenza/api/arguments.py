"""Checks of the public API's arguments: text (valid Unicode, no NUL), seeds, speeds, ids, devices, decoded samples.

Each raises a ``cadenza.errors`` subclass naming the argument; messages never echo a long argument whole. The server
and the CLI use the same checks, so a value is refused the same way everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Sequence

import numpy as np
import torch

from cadenza.errors import AudioError, InputError, TextError, UnknownSpeakerError
from cadenza.voices.validation import MAX_TRANSCRIPT_CHARS

MAX_SEED = 2**63 - 1  # a request's RNG is a torch.Generator: seeds are signed 64-bit
MAX_SPEAKER_CHARS = 128  # no saved speaker id (64) or voice name or id (the server's limit: 128) is longer
MAX_SPEAKER_ID_CHARS = 64
# A prompt's transcript: the voice store's limit (a prompt is at most 30 s). Unbounded, a 100,000-word transcript
# ran the LM for minutes before any error. Instructions and voice descriptions: the server's limit (OpenAI's).
MAX_PROMPT_TEXT_CHARS = MAX_TRANSCRIPT_CHARS
MAX_INSTRUCTIONS_CHARS = 4096


def short_repr(value: object) -> str:
    """``repr(value)`` cut to 80 characters (error messages never echo a 10 kB argument whole)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}... ({len(text)} characters)"


def check_chars(text: str, what: str, error: type[InputError] = TextError) -> str:
    """``text`` unless it holds a lone surrogate (not encodable as UTF-8) or a NUL: ``error`` naming ``what`` and
    where (the server refuses both the same way)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{what} is not valid Unicode: a lone surrogate U+{ord(text[exc.start]):04X} at character "
                    f"{exc.start}") from None
    if "\x00" in text:
        raise error(f"{what} contains a NUL character at character {text.index(chr(0))}")
    return text


def check_text_arg(text: object, what: str, optional: bool = False, max_chars: int | None = None) -> str | None:
    """A text argument: a string (or None when ``optional``) of valid Unicode without NUL, of at most ``max_chars``
    characters when given; else ``TextError``."""
    if text is None and optional:
        return None
    if not isinstance(text, str):
        raise TextError(f"{what} must be a string, not {type(text).__name__}")
    if max_chars is not None and len(text) > max_chars:
        raise TextError(f"{what} is {len(text)} characters; at most {max_chars}")
    return check_chars(text, what)


def check_prompt_text(prompt_text: object) -> str | None:
    """``prompt_text`` (a prompt's transcript): None or a checked string of at most ``MAX_PROMPT_TEXT_CHARS``."""
    return check_text_arg(prompt_text, "prompt_text", optional=True, max_chars=MAX_PROMPT_TEXT_CHARS)


def check_seed(seed: object) -> int | None:
    """None or an integer in [0, 2**63): ``InputError`` naming ``seed`` otherwise."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) <= MAX_SEED:
        raise InputError(f"seed must be an integer from 0 to 2**63-1, got {short_repr(seed)}")
    return int(seed)


def seed_at(seed: int | None, offset: int) -> int | None:
    """The seed of the ``offset``-th request of a text spoken with ``seed`` (a segment, a sentence), wrapped into
    [0, 2**63) as ``check_seed`` allows: a seed near the top must not fail half-way through a text. None: None."""
    return None if seed is None else (int(seed) + offset) % (MAX_SEED + 1)  # int: a numpy seed would overflow


def check_speaker(speaker: object, known: Container[str]) -> str:
    """A speaker argument: a non-empty string of sane characters, and not longer than any saved name unless
    ``known`` (the saved speakers) has it."""
    if not isinstance(speaker, str):
        raise InputError(f"speaker must be a string (a saved speaker id or voice name), not {type(speaker).__name__}")
    check_chars(speaker, "speaker", InputError)
    if not speaker.strip():
        raise UnknownSpeakerError("speaker is empty: give a saved speaker id or voice name")
    if len(speaker) > MAX_SPEAKER_CHARS and speaker not in known:
        raise UnknownSpeakerError(f"speaker is {len(speaker)} characters: no saved speaker id or voice name is "
                                  f"longer than {MAX_SPEAKER_CHARS}")
    return speaker


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past float's range
        return False


def check_speed(speed: object) -> float:
    if isinstance(speed, bool) or not isinstance(speed, (int, float, np.integer, np.floating)) \
            or not _finite(speed):
        raise InputError(f"speed must be a finite number (0.5-2.0), got {short_repr(speed)}")
    return float(speed)


def check_ids(ids: object, what: str) -> object:
    """Token ids: a sequence of integers or an integer array/tensor (1-D, or [1, n]); ``InputError`` otherwise."""
    if isinstance(ids, (torch.Tensor, np.ndarray)):
        kind = str(ids.dtype)
        integer = (ids.dtype != torch.bool and not ids.dtype.is_floating_point and not ids.dtype.is_complex
                   if isinstance(ids, torch.Tensor) else ids.dtype.kind in "iu")
        if not integer or ids.ndim > 2 or (ids.ndim == 2 and ids.shape[0] != 1):
            raise InputError(f"{what} must be integer token ids, shape [n] or [1, n]; got {kind} of shape "
                             f"{tuple(ids.shape)}")
        return ids
    if isinstance(ids, (str, bytes, bytearray)) or not isinstance(ids, Sequence):
        raise InputError(f"{what} must be a sequence of integer token ids, not {type(ids).__name__}")
    for i, v in enumerate(ids):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise InputError(f"{what} must be integer token ids; item {i} is {short_repr(v)} ({type(v).__name__})")
    return ids


def check_device(device: object) -> str | torch.device:
    """A torch device this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``); ``InputError`` otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise InputError(f"device {short_repr(device)} is not a torch device (cpu, cuda, cuda:1, mps)") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {short_repr(device)}: CUDA is not available on this machine (use cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"device {short_repr(device)}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise InputError(f"device {short_repr(device)}: MPS is not available on this machine (use cpu)")
    elif dev.type != "cpu":
        raise InputError(f"device {short_repr(device)}: device type {dev.type!r} is not supported (cpu, cuda, mps)")
    return device


def pcm_to_float(samples: object) -> np.ndarray:
    """Decoded samples -> float32: floats as they are ([-1, 1]), integer PCM scaled to [-1, 1]."""
    try:
        arr = samples.detach().cpu().numpy() if isinstance(samples, torch.Tensor) else np.asarray(samples)
    except (ValueError, TypeError, RuntimeError) as exc:  # ragged lists, tensors numpy cannot hold
        raise AudioError(f"prompt audio samples are not an array of numbers: {exc}") from exc
    if arr.dtype.kind == "f":
        return arr.astype(np.float32, copy=False)
    if arr.dtype.kind in "iu":
        half = float(2 ** (8 * arr.dtype.itemsize - 1))
        offset = half if arr.dtype.kind == "u" else 0.0  # unsigned PCM (8-bit WAV) is centred on 2**(bits-1)
        return ((arr.astype(np.float64) - offset) / half).astype(np.float32)
    raise AudioError(f"prompt audio samples must be numbers (float in [-1, 1] or integer PCM), got dtype {arr.dtype}")


def reference_as_prompt(reference_wav, prompt_wav, prompt_text, prompt_text_ids):
    """``reference_wav`` (a voice to copy, no transcript) is CosyVoice 2's cross-lingual ``prompt_wav``."""
    if reference_wav is None:
        return prompt_wav
    if prompt_wav is not None:
        raise InputError("CosyVoice 2 clones from one recording: give prompt_wav (with prompt_text: zero-shot) or "
                         "reference_wav (its voice only: cross-lingual), not both")
    if prompt_text is not None or prompt_text_ids is not None:
        raise InputError("reference_wav copies a voice without its transcript: for zero-shot cloning with a "
                         "transcript pass the recording as prompt_wav")
    return reference_wav


# What ``Cadenza.synthesize`` / ``synthesize_iter`` / ``synthesize_stream`` of a text take besides it
# (``request_batches`` and the SSML / lexicon path).
SYNTHESIS_ARGUMENTS = ("text_ids", "normalize", "prompt_wav", "prompt_text", "prompt_text_ids", "instruct", "speaker",
                       "seed", "speed", "reference_wav")
# Arguments of other APIs that callers send to ours by habit, and what ours calls them.
_INSTEAD = {"voice": "speaker= (a saved voice) or prompt_wav= (a recording)", "prompt_audio": "prompt_wav=",
            "prompt_speech": "prompt_wav=", "reference_audio": "reference_wav=", "spk_id": "speaker=",
            "zero_shot_spk_id": "speaker=", "instruct_text": "instruct=", "tts_text": "text", "stream": "synthesize_stream"}


def refuse_unknown(unknown: dict, where: str, takes: Iterable[str]) -> None:
    """An ``InputError`` naming the first argument in ``unknown`` (keyword arguments a method does not take) and what
    to pass instead, rather than Python's ``TypeError`` naming an inner method the caller never called."""
    if unknown:
        name = next(iter(unknown))
        hint = f" (use {_INSTEAD[name]})" if name in _INSTEAD else ""
        raise InputError(f"{where} takes no argument {name!r}{hint}; it takes {', '.join(sorted(takes))}")


def check_flag(value: object, what: str) -> bool:
    """``value`` when it is ``True`` or ``False`` (a string such as ``"no"`` would count as true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{what} must be True or False, not {short_repr(value)}")
    return bool(value)
