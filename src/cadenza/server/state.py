"""What the endpoints share: the served models, the voice store, settings, metrics, admission control.

Every model is reached through ``cadenza.api.protocol.SpeechModel`` only, so the server serves any family.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import anyio

from cadenza.api.protocol import SpeechModel
from cadenza.errors import CheckpointError, MissingDependencyError
from cadenza.server.config import ServerConfig
from cadenza.server.engine_stream import Admission
from cadenza.server.errors import APIError, from_exception
from cadenza.server.metrics import Metrics
from cadenza.voices import VoiceStore
from cadenza.voices.prompts import PromptLibrary

# Names OpenAI's clients send by default: they select the default (first) model when several are served.
OPENAI_MODEL_NAMES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


@dataclass
class ServedModel:
    """One model of the server: its name in requests, the model, and the saved voices as its prompts."""

    name: str
    tts: SpeechModel
    prompts: PromptLibrary

    @property
    def sample_rate(self) -> int:
        return int(self.tts.sample_rate)

    @property
    def capabilities(self):
        return self.tts.capabilities

    def describe(self, created: int) -> dict:
        """The ``/v1/models`` entry: OpenAI's fields, plus what the model can do and its queue limits."""
        limits = self.tts.limits
        return {"id": self.name, "object": "model", "created": created, "owned_by": "cadenza",
                "capabilities": self.capabilities.to_dict(),
                "limits": {"max_active": limits.max_active, "max_queued": limits.max_queued}}


@dataclass
class ServerState:
    models: dict[str, ServedModel]  # in order; the first is the default
    voices: VoiceStore
    config: ServerConfig
    metrics: Metrics = field(default_factory=Metrics)
    admission: Admission = field(init=False)
    model_failure: str | None = field(default=None, init=False)  # why /health says the model cannot run
    _limiter: anyio.CapacityLimiter | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    @classmethod
    def create(cls, models: Mapping[str, SpeechModel], voices: VoiceStore, config: ServerConfig) -> ServerState:
        if not models:
            raise ValueError("serve at least one model")
        served = {name: ServedModel(name, tts, tts.prompt_library(voices, config.prompt_cache_size))
                  for name, tts in models.items()}
        return cls(served, voices, config)

    def __post_init__(self) -> None:
        self.admission = Admission(self.config.max_concurrency, self.config.retry_after_s,
                                   max_work=self.config.max_inflight_audio_seconds)

    @property
    def default(self) -> ServedModel:
        return next(iter(self.models.values()))

    def model(self, name: str | None, param: str = "model") -> ServedModel:
        """The model a request names. One model served: any name selects it (OpenAI clients send their own model
        names); several: a served name, or one of OpenAI's for the default; else 404 naming the served ones."""
        if name in self.models:
            return self.models[name]
        if len(self.models) == 1 or name is None or name in OPENAI_MODEL_NAMES:
            return self.default
        raise APIError(404, f"model {name[:80]!r} is not served here; served: {', '.join(self.models)}",
                       param=param, code="model_not_found")

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

    def load(self) -> tuple[int, int]:
        """(active, queued) requests of all models' engines together."""
        loads = [m.tts.load for m in self.models.values()]
        return sum(a for a, _ in loads), sum(q for _, q in loads)
