"""Server settings (``cadenza serve`` flags map onto these); docs/server.md "Limits and security" lists them all."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def valid_model_name(name: object) -> bool:
    return isinstance(name, str) and _MODEL_NAME.fullmatch(name) is not None


def model_name_of(directory) -> str:
    """A served model's default name: its folder's name, made safe (``cadenza-tiny`` for the built-in model; the
    repository's name for a hub download)."""
    from cadenza.loading.hub import folder_name

    raw = folder_name(directory) if isinstance(directory, (str, os.PathLike)) else getattr(directory, "name", "")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(raw or "model")).strip("-._")[:64]
    return name if valid_model_name(name) else "model"
ANY = "*"


@dataclass(frozen=True)
class ServerConfig:
    """Limits and options of the HTTP/WebSocket server.

    Access: ``api_key``: when set, every endpoint but ``/health`` needs ``Authorization: Bearer <key>``.
    ``admin_key``: the operator's key for ``/v1/admin/...`` (takedown, audit log); without it those are off (403).
    ``allowed_hosts``: ``Host`` header values (without port) the server answers; ``None`` picks a default: any host
    with a key, loopback names without one (a page on another site cannot then reach an open server through DNS
    rebinding). ``"*"`` allows any. ``allowed_origins``: browser origins (``https://app.example.com``) allowed to call
    the server besides its own (same-origin) pages; ``"*"`` allows any.

    Work: ``max_concurrency``: synthesis requests (HTTP and WebSocket together) in flight at once;
    ``max_inflight_audio_seconds``: the estimated audio of all of them together (admission counts work, not only
    requests); beyond either, 429 at once. ``max_input_chars``: the ``input`` text as sent (OpenAI's limit is 4096);
    ``max_normalized_chars``: the text after normalisation (numbers, symbols read out); ``max_audio_seconds``: the
    audio one request may make (refused up front from an estimate, and cut there if the model runs on).
    ``max_segment_tokens``: longer inputs are split at sentence boundaries and spoken segment after segment.

    Uploads: ``max_upload_bytes`` (one voice's or conversion's audio file), ``max_prompt_seconds`` (a voice's
    duration) and ``max_conversion_seconds`` (a voice conversion's source, at most 300 s): decoding stops there,
    whatever the file's header claims. ``max_lora_bytes``: one uploaded LoRA adapter's weights file
    (``POST /v1/admin/loras``); ``max_loras``: adapters one VoxCPM 2 model may hold (uploaded and ``--lora`` together).

    Connections: ``ws_idle_timeout_s``: a WebSocket session whose client sends no text for this long before
    ``input.done`` is closed (empty pieces do not count); ``ws_max_session_s``: the longest a WebSocket session may
    last; ``header_timeout_s``: a connection must send its request headers within this time (``cadenza serve``);
    ``max_connections``: open connections at most (``cadenza serve``; more get 503).

    Other: ``prompt_cache_size``: voices whose computed prompt features are kept in memory; ``retry_after_s``: the
    ``Retry-After`` header of 429 answers; ``model_name``: the name ``/v1/models`` lists for a server of one model
(``None``: the model folder's name, ``cadenza-tiny`` for the built-in model).
    """

    api_key: str | None = None
    admin_key: str | None = None
    allowed_hosts: tuple[str, ...] | None = None
    allowed_origins: tuple[str, ...] = ()
    max_concurrency: int = 16
    max_inflight_audio_seconds: float = 1800.0
    max_input_chars: int = 4096
    max_normalized_chars: int = 8192
    max_audio_seconds: float = 600.0
    max_segment_tokens: int = 80
    max_upload_bytes: int = 10 * 2**20
    max_prompt_seconds: float = 30.0
    max_conversion_seconds: float = 240.0
    max_lora_bytes: int = 256 * 2**20
    max_loras: int = 16
    ws_idle_timeout_s: float = 60.0
    ws_max_session_s: float = 900.0
    header_timeout_s: float = 10.0
    max_connections: int = 1024
    prompt_cache_size: int = 64
    retry_after_s: int = 1
    model_name: str | None = None

    def __post_init__(self) -> None:
        if self.api_key is not None and (not isinstance(self.api_key, str) or len(self.api_key) < 8
                                         or self.api_key != self.api_key.strip()):
            raise ValueError("api_key must be a string of at least 8 characters without surrounding spaces")
        if self.admin_key is not None and (not isinstance(self.admin_key, str) or len(self.admin_key) < 16
                                           or self.admin_key != self.admin_key.strip()
                                           or self.admin_key == self.api_key):
            raise ValueError("admin_key must be a string of at least 16 characters without surrounding spaces, "
                             "and not the api_key")
        for name in ("max_concurrency", "max_upload_bytes", "max_lora_bytes", "max_loras", "max_input_chars",
                     "max_normalized_chars", "max_segment_tokens", "max_connections", "prompt_cache_size",
                     "retry_after_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("max_inflight_audio_seconds", "max_audio_seconds", "max_prompt_seconds", "max_conversion_seconds",
                     "ws_idle_timeout_s", "ws_max_session_s", "header_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                                         and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.max_conversion_seconds > 300.0:
            raise ValueError("max_conversion_seconds must be in (0, 300] (what voice conversion renders at most)")
        if self.max_prompt_seconds > 30.0:
            raise ValueError("max_prompt_seconds must be in (0, 30] (the frontends read at most 30 s of prompt)")
        if self.max_inflight_audio_seconds < self.max_audio_seconds:
            raise ValueError("max_inflight_audio_seconds must be at least max_audio_seconds (else a request of the "
                             "allowed size could never be admitted)")
        if self.max_normalized_chars < self.max_input_chars:
            raise ValueError("max_normalized_chars must be at least max_input_chars")
        for name in ("allowed_hosts", "allowed_origins"):
            value = getattr(self, name)
            if value is None and name == "allowed_hosts":
                continue
            if not isinstance(value, tuple) or not all(isinstance(v, str) and v and v == v.strip() for v in value):
                raise ValueError(f"{name} must be a tuple of non-empty strings, got {value!r}")
        if any(o != ANY and (not o.startswith(("http://", "https://")) or o.endswith("/"))
               for o in self.allowed_origins):
            raise ValueError("allowed_origins are 'scheme://host[:port]' (no path, no trailing '/') or '*', got "
                             f"{self.allowed_origins!r}")
        if self.model_name is not None and not valid_model_name(self.model_name):
            raise ValueError(f"model_name must be 1-64 letters, digits, '.', '_' or '-', got {self.model_name!r}")

    @property
    def conversion_source_seconds(self) -> float:
        """The longest source a voice conversion takes: ``max_conversion_seconds``, and no more than one request may
        make (``max_audio_seconds``: the output is as long as the source, and would be cut there)."""
        return min(self.max_conversion_seconds, self.max_audio_seconds)

    @property
    def hosts(self) -> tuple[str, ...]:
        """The allowed ``Host`` names in effect (lower case)."""
        if self.allowed_hosts is None:
            return (ANY,) if self.api_key is not None else LOOPBACK_HOSTS
        return tuple(h.lower().strip("[]") for h in self.allowed_hosts)
