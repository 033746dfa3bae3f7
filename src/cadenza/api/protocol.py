"""``SpeechModel``: what every model family's API object offers (``Cadenza`` for CosyVoice 2, ``VoxCPM2``), so that
the CLI and the server work with any family without knowing which it is.

Two halves: the user's (``synthesize``, ``synthesize_stream``, ``sample_rate``, ``capabilities``) and the server's,
in the order a request goes through them::

    segments = tts.segments(text, max_tokens=...)         # normalised text, split where a reader pauses
    voice = tts.prompt_library(store).resolve("alice")    # a saved voice as this model's prompt (or None)
    plan = tts.plan(segments, voice, instructions=..., seed=..., speed=...)   # engine requests, one per segment
    for chunk in tts.submit(plan.requests[0]): ...        # float32 audio at tts.sample_rate; .cancel() frees it
    stream = tts.open_text_stream(voice, ...)             # text in as it is written (stream.feed / stream.end)

Requests are the family's own objects; only the family that planned them runs them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from cadenza.api.audio import Audio
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.provenance.marking import OutputMark
from cadenza.voices.prompts import PromptLibrary, Voice
from cadenza.voices.store import VoiceStore


@dataclass(frozen=True)
class Capabilities:
    """What a loaded model can do (``/v1/models`` lists it; the server refuses what a model cannot do).

    ``instructions``: what the OpenAI ``instructions`` field does: ``"instruct"`` (CosyVoice 2's natural-language
    style instruction, with a voice) or ``"voice_design"`` (VoxCPM 2: describes the voice itself; with a reference
    voice it steers it), or ``"none"`` (not trained with any, as cadenza-tiny: the server refuses the field).
    ``speed``: the speaking rates the model makes (streamed too; docs/controls.md), ``None`` = 1.0 only. ``word_timestamps``: word timings can be asked for (``timestamps``; the packaged aligner, any model).
    ``text_streaming``: how text that arrives piece by piece is read: ``"tokens"`` (the LM interleaves text and
    speech as tokens arrive) or ``"sentences"`` (each sentence is spoken once it is complete). ``default_voice``:
    the model speaks without a voice being named. ``output_frame_samples``: output samples per generated step (a
    speech token, or a latent patch), for usage accounting.
    """

    family: str
    title: str
    sample_rate: int
    modes: tuple[str, ...]
    instructions: str
    speed: tuple[float, float] | None
    text_streaming: str
    cloning_modes: tuple[str, ...]
    default_voice: bool
    output_frame_samples: int
    word_timestamps: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Plan:
    """Engine requests for the segments of one input, in order, and how many text tokens they read."""

    requests: list
    text_tokens: int


@runtime_checkable
class ChunkStream(Protocol):
    """Float32 audio chunks of one submitted request; ``cancel()`` (any thread, idempotent) frees it."""

    def __iter__(self) -> Iterator[np.ndarray]: ...

    def cancel(self) -> None: ...


@runtime_checkable
class TextStream(Protocol):
    """A request whose text arrives piece by piece: ``feed`` pieces, then ``end()``; iterate for audio chunks.
    ``fail(exc)`` ends it with ``exc`` (the reader gets it); ``cancel()`` frees it."""

    def feed(self, text: str) -> None: ...

    def end(self) -> None: ...

    def fail(self, exc: BaseException) -> None: ...

    def __iter__(self) -> Iterator[np.ndarray]: ...

    def cancel(self) -> None: ...


@runtime_checkable
class SpeechModel(Protocol):
    family: str
    directory: Path
    mark: OutputMark  # the provenance watermark of every output (off only if the operator said so at load)

    @property
    def sample_rate(self) -> int: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def synthesize(self, text: str, **kwargs) -> Audio: ...

    def synthesize_stream(self, text: str, **kwargs) -> Iterator[np.ndarray]: ...

    def prompt_library(self, store: VoiceStore, cache_size: int = 64) -> PromptLibrary: ...

    def segments(self, text: str, normalize: bool = True, max_tokens: int | None = None) -> list[str]: ...

    def speakable(self, text: str) -> bool: ...

    def plan(self, segments: Sequence[str], voice: Voice | None, *, instructions: str | None = None,
             seed: int | None = None, speed: float = 1.0) -> Plan: ...

    def submit(self, request, stream: bool = True) -> ChunkStream: ...

    def open_text_stream(self, voice: Voice | None, *, instructions: str | None = None,
                         seed: int | None = None, speed: float = 1.0) -> TextStream: ...

    @property
    def load(self) -> tuple[int, int]: ...

    @property
    def limits(self) -> SchedulerConfig: ...

    def close(self) -> None: ...
