"""What the endpoints share: the model, the voice store, settings, metrics, admission control, prompt cache."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import anyio

from cadenza.errors import CheckpointError, MissingDependencyError
from cadenza.server.config import ServerConfig
from cadenza.server.engine_stream import Admission
from cadenza.server.errors import APIError, from_exception
from cadenza.server.metrics import Metrics
from cadenza.voices import VoiceStore
from cadenza.voices.prompts import VoicePrompts


@dataclass
class ServerState:
    tts: object  # a Cadenza (or anything with .engine, .sample_rate, .voice_from_audio)
    voices: VoiceStore
    config: ServerConfig
    metrics: Metrics = field(default_factory=Metrics)
    prompts: VoicePrompts = field(init=False)
    admission: Admission = field(init=False)
    model_failure: str | None = field(default=None, init=False)  # why /health says the model cannot run
    _limiter: anyio.CapacityLimiter | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        shared = getattr(self.tts, "voice_prompts", None)
        # One feature cache per store: share the API's when the server serves the same store.
        self.prompts = (shared if shared is not None and getattr(self.tts, "voices", None) is self.voices
                        else VoicePrompts(self.tts, self.voices, self.config.prompt_cache_size))
        self.admission = Admission(self.config.max_concurrency, self.config.retry_after_s,
                                   max_work=self.config.max_inflight_audio_seconds)

    def error(self, exc: BaseException, param: str | None = None) -> APIError:
        """The client's answer for ``exc``; a failure of the model's files also turns ``/health`` to 503."""
        if isinstance(exc, (CheckpointError, MissingDependencyError)):
            self.model_failure = type(exc).__name__
        return from_exception(exc, self.config.retry_after_s, param=param)

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        """Worker threads for blocking engine reads: one per admitted request, plus room for voice work.

        Created on first use, inside the event loop (anyio limiters belong to a running loop).
        """
        with self._lock:
            if self._limiter is None:
                self._limiter = anyio.CapacityLimiter(self.config.max_concurrency + 8)
            return self._limiter

    @property
    def sample_rate(self) -> int:
        return int(self.tts.sample_rate)

    @property
    def engine_limits(self):
        """The engine scheduler's ``SchedulerConfig`` (its ``max_active`` / ``max_queued``)."""
        return self.tts.engine.scheduler.config

    def load(self) -> tuple[int, int]:
        """(active, queued) requests of the engine's scheduler."""
        return self.tts.engine.scheduler.load

    def submit(self, request, stream: bool):
        return self.tts.engine.scheduler.submit(request, stream=stream)
