"""``PipelineState``: what the CosyVoice 2 scheduler's LM worker and vocoder workers tell each other.

Read and written under the board's lock only. The worker layout is set once, when the workers start.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PipelineState:
    lm_steps: int = 0  # LM steps run so far (the clock of the flow batch wait)
    lm_busy: bool = False  # the LM worker has work (a waiting flow chunk may expect partners)
    first_audio_pending: bool = False  # a request's first chunk is being made: the LM steps only those still short
    vocoding: int = 0  # vocoder workers inside a piece of work
    vocoder_workers: int = 1  # the layout, set when the workers start
    cores: int = 1
    lm_threads: int = 1
    vocoder_threads: int = 1
    flow_cache_budget: int | None = None  # bytes all requests' flow caches may hold (``SchedulerConfig``), set at start

    def lm_competes(self, starting: int = 0) -> bool:
        """Whether the LM and the vocoder workers at work (plus ``starting`` more) need more threads than there are
        cores."""
        return (self.vocoding + starting) * self.vocoder_threads + self.lm_threads > self.cores

    @property
    def room_beside_lm(self) -> bool:
        """Whether one vocoder worker can ever run beside the LM on cores of its own (``lm_competes(1)`` with no
        other worker at work): where flow ahead can run at all."""
        return self.vocoder_threads + self.lm_threads <= self.cores
