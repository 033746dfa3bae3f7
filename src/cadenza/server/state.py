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
LORA_SEPARATOR = ":"  # "model:adapter" selects a LoRA adapter of a served model (model names have no ':')


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

    def check_instructions(self, instructions: str | None) -> None:
        """Refuse ``instructions`` (400, naming the field) when the model takes none: before any work is queued."""
        if instructions and instructions.strip() and self.capabilities.instructions == "none":
            raise APIError(400, f"model {self.name!r} was not trained with instructions: leave instructions out",
                           param="instructions", code="unsupported_value")

    @property
    def takes_loras(self) -> bool:
        """Whether requests may pick a per-request LoRA adapter of this model (VoxCPM 2)."""
        return callable(getattr(self.tts, "register_lora", None))

    @property
    def loras(self) -> list[str]:
        return list(self.tts.loras) if self.takes_loras else []

    def describe(self, created: int) -> dict:
        """The ``/v1/models`` entry: OpenAI's fields, plus what the model can do and its queue limits."""
        limits = self.tts.limits
        entry = {"id": self.name, "object": "model", "created": created, "owned_by": "cadenza",
                 "capabilities": self.capabilities.to_dict(),
                 "limits": {"max_active": limits.max_active, "max_queued": limits.max_queued}}
        if self.takes_loras:
            entry["loras"] = self.loras
        return entry

    def describe_lora(self, lora: str, created: int) -> dict:
        """The ``/v1/models`` entry of adapter ``lora``: a model of its own with a ``parent`` (as vLLM lists
        adapters), and the parent's capabilities and limits (clients pick it like any model)."""
        entry = {k: v for k, v in self.describe(created).items() if k != "loras"}
        return {**entry, "id": f"{self.name}{LORA_SEPARATOR}{lora}", "parent": self.name, "lora": lora}


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
        names); several: a served name, or one of OpenAI's for the default; else 404 naming the served ones.
        ``"<model>:<adapter>"`` names that model (e.g. a voice saved for an adapter's model is its model's)."""
        if name in self.models:
            return self.models[name]
        if name is not None and LORA_SEPARATOR in name:
            return self.route(name, param=param)[0]
        if len(self.models) == 1 or name is None or name in OPENAI_MODEL_NAMES:
            return self.default
        raise APIError(404, f"model {name[:80]!r} is not served here; served: {', '.join(self.models)}",
                       param=param, code="model_not_found")

    def route(self, name: str | None, lora: str | None = None, param: str = "model",
              lora_param: str = "lora") -> tuple[ServedModel, str | None]:
        """(model, adapter name or None) of a request's ``model`` and ``lora`` fields. ``model`` may be
        ``"<model>:<adapter>"`` (``<model>`` a served name, or ``voxcpm2`` when one VoxCPM 2 model is served). A
        model without per-request adapters given one: 400 naming the field; an unknown adapter: 404 listing the
        registered ones."""
        from_model = None
        if name is not None and LORA_SEPARATOR in name:
            prefix, _, from_model = name.partition(LORA_SEPARATOR)
            served = self.models.get(prefix)
            family = [m for m in self.models.values() if m.capabilities.family == prefix]
            if served is None and len(family) == 1:
                served = family[0]
            if served is None:
                raise APIError(404, f"model {prefix[:80]!r} (of {name[:120]!r}) is not served here; served: "
                               f"{', '.join(self.models)}", param=param, code="model_not_found")
            if lora is not None and lora != from_model:
                raise APIError(400, f"model names the LoRA adapter {from_model[:80]!r} and lora names "
                               f"{lora[:80]!r}: give one", param=lora_param, code="invalid_value")
        else:
            served = self.model(name, param)
        adapter = lora if lora is not None else from_model
        if adapter is None:
            return served, None
        which = lora_param if lora is not None else param
        if not served.takes_loras:
            raise APIError(400, f"{served.capabilities.title} models take no per-request LoRA adapter ({which}); "
                           "VoxCPM 2 models do", param=which, code="unsupported_value")
        if adapter not in served.loras:
            raise APIError(404, f"no LoRA adapter {adapter[:80]!r} on model {served.name!r}; registered: "
                           f"{', '.join(served.loras) or 'none'}", param=which, code="lora_not_found")
        return served, adapter

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
