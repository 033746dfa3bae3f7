"""Server settings (``cadenza serve`` flags map onto these)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerConfig:
    """Limits and options of the HTTP/WebSocket server.

    ``api_key``: when set, every endpoint but ``/health`` needs ``Authorization: Bearer <key>``.
    ``max_concurrency``: synthesis requests (HTTP and WebSocket together) in flight at once; more get 429 right away
    (the engine's own queue limit gives 429 too). ``max_upload_bytes``: one voice upload (the audio file);
    ``max_prompt_seconds``: its duration. ``max_input_chars``: the ``input`` text (OpenAI's limit is 4096).
    ``max_segment_tokens``: longer inputs are split at sentence boundaries and spoken segment after segment (the
    engine takes at most 1000 text tokens per request, and the LM is steadier on shorter ones).
    ``ws_idle_timeout_s``: a WebSocket session that sends nothing for this long is closed and its request freed.
    ``prompt_cache_size``: voices whose computed prompt features are kept in memory (the rest are re-read from the
    voice store's on-disk cache). ``retry_after_s``: the ``Retry-After`` header of 429 answers.
    """

    api_key: str | None = None
    max_concurrency: int = 16
    max_upload_bytes: int = 10 * 2**20
    max_prompt_seconds: float = 30.0
    max_input_chars: int = 4096
    max_segment_tokens: int = 80
    ws_idle_timeout_s: float = 60.0
    prompt_cache_size: int = 64
    retry_after_s: int = 1
    model_name: str = "cadenza-cosyvoice2"

    def __post_init__(self) -> None:
        if self.api_key is not None and (not isinstance(self.api_key, str) or len(self.api_key) < 8
                                         or self.api_key != self.api_key.strip()):
            raise ValueError("api_key must be a string of at least 8 characters without surrounding spaces")
        for name in ("max_concurrency", "max_upload_bytes", "max_input_chars", "max_segment_tokens",
                     "prompt_cache_size", "retry_after_s"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not 0 < self.max_prompt_seconds <= 30.0:
            raise ValueError("max_prompt_seconds must be in (0, 30] (the frontends read at most 30 s of prompt)")
        if self.ws_idle_timeout_s <= 0:
            raise ValueError("ws_idle_timeout_s must be positive")
        if not self.model_name:
            raise ValueError("model_name must not be empty")
