"""A synthesis request: everything one utterance needs, resolved from the user's arguments. Owns its own RNG."""

from __future__ import annotations

import numbers
import secrets
from dataclasses import dataclass, field

import torch

from cadenza.errors import InputError
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt


def make_generator(seed: int | None) -> tuple[torch.Generator, int]:
    """A private RNG for one request (the global torch RNG is never touched). ``None`` draws a fresh seed."""
    if seed is None:
        seed = secrets.randbits(63)
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, not {str(seed)[:40]!r}")
    seed = int(seed)  # numpy integers too (the API's check_seed takes them)
    if seed >= 2**64:  # torch's generator takes 64-bit seeds
        raise InputError(f"seed must be below 2**64, got {seed}")
    return torch.Generator().manual_seed(seed), seed


@dataclass
class SynthesisRequest:
    """One utterance.

    ``text_ids`` [1, T] text to speak; ``lm_prompt_text`` [1, Tp] (prompt transcript or instruct text) and
    ``lm_prompt_speech`` [1, Ps] condition the LM; ``voice`` conditions the flow; ``source_tokens`` [1, S] skips the
    LM (voice conversion). ``live_source``: more source tokens arrive after submission, as the source is recorded
    (``StreamHandle.feed_source`` / ``end_source``; live voice conversion), at most ``max_tokens`` in all.
    """

    mode: str
    voice: SpeakerPrompt
    text_ids: torch.Tensor | None = None
    lm_prompt_text: torch.Tensor = field(default_factory=lambda: torch.zeros(1, 0, dtype=torch.long))
    lm_prompt_speech: torch.Tensor = field(default_factory=lambda: torch.zeros(1, 0, dtype=torch.long))
    source_tokens: torch.Tensor | None = None
    live_source: bool = False
    speed: float = 1.0
    seed: int | None = None
    min_tokens: int = 0
    max_tokens: int = 0
    generator: torch.Generator = field(init=False)  # LM sampling
    vocoder_generator: torch.Generator = field(init=False)  # HiFT's NSF source noise

    def __post_init__(self) -> None:
        # Two streams from one seed, so streaming (which interleaves LM and vocoder draws) and non-streaming
        # synthesis of the same seed produce the same speech tokens.
        self.generator, self.seed = make_generator(self.seed)
        self.vocoder_generator, _ = make_generator(self.seed ^ 0x5DEECE66D)
        if self.live_source and (self.source_tokens is None or self.max_tokens <= 0):
            raise ValueError("a live source needs source_tokens (those known so far) and max_tokens > 0")
