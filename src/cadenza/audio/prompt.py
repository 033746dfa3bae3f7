"""Checks that a prompt recording can condition synthesis (it feeds the speech tokenizer, the speaker encoder and
the flow's prompt mel; docs/design.md, "CosyVoice 2 frontend inputs per mode").

Limits: at least 0.5 s (shorter prompts give the speaker encoder and the flow almost nothing to copy), at most 30 s
(the speech tokenizer's whisper front end handles at most 30 s; the reference asserts it). Silence is rejected
because every downstream feature of a silent prompt is a constant floor value and the voice clone is meaningless.
"""

from __future__ import annotations

import numbers

import torch

from cadenza.errors import AudioError

DEFAULT_MIN_SECONDS = 0.5
DEFAULT_MAX_SECONDS = 30.0
# Silence thresholds on [-1, 1] audio. A prompt is "silent" if its peak is below -60 dBFS (nothing ever gets above
# the noise floor of a quiet room recorded at low gain) or its RMS is below -80 dBFS (only isolated clicks in
# digital silence). Either way the log-mel features sit at their clamp floor.
SILENCE_PEAK = 1e-3
SILENCE_RMS = 1e-4
# Float samples are on a [-1, 1] scale; 16-bit PCM passed as floats still reads (the features are scale-tolerant),
# anything louder is not audio on any scale we know, and far enough out it overflows the features to inf/NaN.
MAX_PEAK = 32768.0


def mono_samples(wav: torch.Tensor, what: str = "prompt audio") -> torch.Tensor:
    """``[samples]``, ``[channels, samples]`` or ``[samples, channels]`` -> ``[samples]`` (the smaller axis of a 2-D
    array is taken as the channels and averaged). Raises ``AudioError`` for another rank or an empty 2-D array (its
    mean would be NaN of no channels)."""
    if wav.dim() == 2:
        if 0 in wav.shape:
            raise AudioError(f"{what} has no samples or no channels: shape {tuple(wav.shape)}")
        wav = wav.mean(dim=int(wav.shape[0] > wav.shape[1]))
    if wav.dim() != 1:
        raise AudioError(f"{what} must be [samples] or [channels, samples], got shape {tuple(wav.shape)}")
    return wav


def validate_prompt_audio(
    wav: torch.Tensor,
    sr: int,
    min_seconds: float = DEFAULT_MIN_SECONDS,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    what: str = "prompt audio",
    shorten: str = "trim it to one or two sentences",
) -> torch.Tensor:
    """Check a mono prompt ``wav`` (``[samples]`` or ``[1, samples]``, float in [-1, 1]) sampled at ``sr``.
    ``what`` names it in the errors (``"source audio"`` for voice conversion), ``shorten`` says what to do when it is
    too long.

    Returns ``wav`` unchanged. Raises ``AudioError`` naming the problem: wrong shape, NaN/inf samples, shorter
    than ``min_seconds``, longer than ``max_seconds``, silent (peak < ``SILENCE_PEAK`` or RMS < ``SILENCE_RMS``),
    or louder than any audio scale (peak > ``MAX_PEAK``).
    """
    if isinstance(sr, bool) or not isinstance(sr, numbers.Integral) or sr <= 0:
        raise AudioError(f"sample rate must be a positive integer, got {sr!r}")
    if wav.dim() == 2 and wav.shape[0] == 1:
        samples = wav[0]
    elif wav.dim() == 1:
        samples = wav
    else:
        raise AudioError(f"{what} must be mono [samples] or [1, samples], got shape {tuple(wav.shape)}")
    if not torch.isfinite(samples).all():
        raise AudioError(f"{what} contains NaN or infinite samples")
    seconds = samples.numel() / sr
    if seconds < min_seconds:
        count = samples.numel()
        length = f"{seconds:.2f} s" if seconds >= 0.01 else f"{count} sample{'s' * (count != 1)} ({seconds:.4f} s)"
        raise AudioError(f"{what} is too short: {length}, need at least {min_seconds:g} s")
    if seconds > max_seconds:
        raise AudioError(
            f"{what} is too long: {seconds:.2f} s, the limit is {max_seconds:g} s ({shorten})"
        )
    samples64 = samples.detach().to(torch.float64)  # float64: sums of squares over minutes of audio
    peak = float(samples64.abs().max())
    rms = float(samples64.square().mean().sqrt())
    if peak < SILENCE_PEAK or rms < SILENCE_RMS:
        raise AudioError(
            f"{what} is silent (peak {peak:.2g}, RMS {rms:.2g}; need peak >= {SILENCE_PEAK:g} "
            f"and RMS >= {SILENCE_RMS:g} on a [-1, 1] scale)"
        )
    if peak > MAX_PEAK:
        raise AudioError(f"{what} peaks at {peak:.3g}: samples are floats on a [-1, 1] scale (or integer "
                         "PCM: pass the integer array itself)")
    return wav
