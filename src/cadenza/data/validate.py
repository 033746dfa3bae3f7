"""Checks on every corpus item; a failed check rejects the item with a reason (``ItemRejected``), never the run.

* audio: readable and decodable (``load_audio``), finite, duration within ``[min_seconds, max_seconds]``, not silent
  (peak and RMS floors of ``cadenza.audio.prompt``);
* text: not empty and speakable (not only punctuation);
* text vs audio ("mismatched transcript"): characters per second within ``[min_chars_per_second,
  max_chars_per_second]``, and once both token sequences exist, speech tokens per text token within
  ``[min_token_text_ratio, max_token_text_ratio]`` — the LM's decoding limits (it emits between 2 and 20 speech tokens
  per text token; docs/design.md, "CosyVoice 2 LM sequence layouts"), so an item outside them teaches a length the model
  can never produce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import soundfile as sf
import torch

from cadenza.audio.io import load_audio
from cadenza.audio.prompt import SILENCE_PEAK, SILENCE_RMS
from cadenza.errors import AudioError, InputError
from cadenza.models.cosyvoice2.frontend import check_speakable


class ItemRejected(Exception):
    """The item fails a check; ``str(exc)`` is the reason written to ``rejected.jsonl``, ``category`` its kind
    (``missing``, ``unreadable``, ``too_short``, ``too_long``, ``silent``, ``text``, ``mismatch``, ``extractor``)."""

    def __init__(self, reason: str, category: str) -> None:
        super().__init__(reason)
        self.category = category


@dataclass(frozen=True)
class DataLimits:
    sample_rate: int = 24000
    min_seconds: float = 0.5
    max_seconds: float = 30.0
    min_chars_per_second: float = 1.0
    max_chars_per_second: float = 40.0
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) for v in (self.min_seconds, self.max_seconds, self.min_chars_per_second,
                                                self.max_chars_per_second, self.min_token_text_ratio,
                                                self.max_token_text_ratio)):
            raise InputError("data limits must be finite numbers")
        if not 0 < self.min_seconds < self.max_seconds:
            raise InputError("need 0 < min_seconds < max_seconds")
        if not 0 <= self.min_chars_per_second < self.max_chars_per_second:
            raise InputError("need 0 <= min_chars_per_second < max_chars_per_second")
        if not 0 <= self.min_token_text_ratio < self.max_token_text_ratio:
            raise InputError("need 0 <= min_token_text_ratio < max_token_text_ratio")


def check_text(text: str) -> str:
    try:
        return check_speakable(text, "transcript")
    except InputError as exc:
        raise ItemRejected(str(exc), "text") from exc


def load_checked_audio(path, limits: DataLimits) -> torch.Tensor:
    """Decode ``path`` to mono float32 at ``limits.sample_rate`` and check duration and silence.

    A file whose header says it is longer than ``max_seconds`` is rejected before it is decoded, and decoding never
    goes past ``max_seconds`` (a header that lies costs at most that much audio)."""
    try:
        if not Path(path).is_file():
            if Path(path).exists():
                raise ItemRejected(f"{path} is not a regular file (a folder or a device)", "unreadable")
            raise ItemRejected(f"missing audio file {path}", "missing")
    except OSError as exc:  # a path the OS refuses outright (name too long, no permission)
        raise ItemRejected(f"unreadable audio path: {exc.strerror or exc}", "unreadable") from exc
    try:
        info = sf.info(str(path))
        seconds = info.frames / info.samplerate if info.samplerate > 0 else 0.0
    except (sf.LibsndfileError, RuntimeError, ValueError, TypeError, OSError):
        seconds = 0.0  # not a header libsndfile knows: load_audio below says why
    if seconds > limits.max_seconds:
        raise ItemRejected(f"too long: {seconds:.2f} s > {limits.max_seconds:g} s", "too_long")
    try:
        wav = load_audio(path, limits.sample_rate, max_bytes=None, max_seconds=limits.max_seconds + 1.0)
    except AudioError as exc:
        raise ItemRejected(f"unreadable audio: {exc}", "unreadable") from exc
    except OSError as exc:
        raise ItemRejected(f"unreadable audio: {exc.strerror or exc}", "unreadable") from exc
    seconds = wav.numel() / limits.sample_rate
    if seconds < limits.min_seconds:
        raise ItemRejected(f"too short: {seconds:.2f} s < {limits.min_seconds:g} s", "too_short")
    if seconds > limits.max_seconds:
        raise ItemRejected(f"too long: {seconds:.2f} s > {limits.max_seconds:g} s", "too_long")
    w = wav.to(torch.float64)
    peak, rms = float(w.abs().max()), float(w.square().mean().sqrt())
    if peak < SILENCE_PEAK or rms < SILENCE_RMS:
        raise ItemRejected(f"silent audio (peak {peak:.2g}, RMS {rms:.2g})", "silent")
    return wav


def check_speaking_rate(text: str, seconds: float, limits: DataLimits) -> None:
    chars = sum(1 for c in text if c.isalnum())
    rate = chars / seconds
    if rate < limits.min_chars_per_second or rate > limits.max_chars_per_second:
        raise ItemRejected(
            f"transcript does not fit the audio: {chars} letters in {seconds:.2f} s = {rate:.1f}/s, outside "
            f"[{limits.min_chars_per_second:g}, {limits.max_chars_per_second:g}]", "mismatch"
        )


def check_token_ratio(n_speech: int, n_text: int, limits: DataLimits) -> None:
    if n_text <= 0:
        raise ItemRejected("the transcript gives no text tokens", "text")
    ratio = n_speech / n_text
    if ratio < limits.min_token_text_ratio or ratio > limits.max_token_text_ratio:
        raise ItemRejected(
            f"transcript does not fit the audio: {n_speech} speech tokens for {n_text} text tokens = {ratio:.1f}, "
            f"outside [{limits.min_token_text_ratio:g}, {limits.max_token_text_ratio:g}]", "mismatch"
        )
