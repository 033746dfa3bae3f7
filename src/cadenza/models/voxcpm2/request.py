"""One VoxCPM 2 synthesis request: everything resolved from the user's arguments, owned by that request alone.

Built by ``VoxCPM2Engine.build``; the engine's ``synthesize`` / ``stream`` read it and fill in ``outcome``. Nothing
here lives on the shared model: the noise of attempt ``k`` comes from a private generator seeded ``seed + k``
(created when the attempt starts), KV caches and decoder state are created per run and freed when it ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from cadenza.models.voxcpm2.generate import GenerationOptions
from cadenza.models.voxcpm2.layouts import SequenceLayout, VoicePrompt
from cadenza.models.voxcpm2.lora_bank import BankedLoRA
from cadenza.models.voxcpm2.request_text import RequestText
from cadenza.models.voxcpm2.retry import RetryOutcome, RetryPolicy

# mode name -> (has reference audio, has continuation prompt)
MODES = {
    "plain": (False, False),  # text only (also with a voice-design description: see ``voice_design``)
    "reference": (True, False),  # clone the voice of reference audio
    "continuation": (False, True),  # continue a recording whose transcript is known
    "combined": (True, True),  # reference audio + continuation prompt
}


def mode_of(voice: VoicePrompt | None) -> str:
    if voice is None:
        return "plain"
    has = (voice.ref_patches is not None, voice.prompt_patches is not None)
    return next(name for name, flags in MODES.items() if flags == has)


@dataclass(eq=False)
class VoxCPM2Request:
    """A prepared utterance.

    ``text.text`` is what the model reads; ``layout`` the LM prompt sequence; ``target_len`` the number of ids of the
    target text alone (length cap and bad-case rule); ``options.max_len`` the caller's hard cap (the retry policy's
    loop cap ``min(int(target_len · ratio + 10), max_len)`` applies on top).
    Layouts: docs/design.md, "VoxCPM 2 sequence layouts".
    """

    text: RequestText
    voice: VoicePrompt | None
    layout: SequenceLayout
    target_len: int
    options: GenerationOptions
    retry: RetryPolicy
    seed: int
    reference_onset: bool = False  # streaming: cold decoder start as the reference (see streaming.py)
    noise: torch.Tensor | Sequence[torch.Tensor] | None = None  # replay these draws in attempt 1 (tests/parity)
    lora: BankedLoRA | None = None  # the adapter applied to this request's rows only (lora_bank.py)
    speed: float = 1.0  # speaking rate, applied to the output by the API (WSOLA, docs/controls.md "Speed")
    outcome: RetryOutcome = field(default_factory=RetryOutcome)

    @property
    def mode(self) -> str:
        """``plain``, ``reference``, ``continuation`` or ``combined``."""
        return mode_of(self.voice)

    @property
    def voice_design(self) -> bool:
        """True when the text starts with a ``(description)`` (plain mode = voice design; with reference audio =
        controllable cloning)."""
        return self.text.is_voice_design

    @property
    def seed_used(self) -> int | None:
        """Seed of the attempt whose audio was returned (after a run; the reference's ``last_successful_seed``)."""
        return self.outcome.seed
