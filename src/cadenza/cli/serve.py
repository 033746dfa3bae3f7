"""``cadenza serve``: the OpenAI-compatible speech server (needs ``pip install 'cadenza[server]'``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from cadenza.cli.args import (
    MODEL_ENV,
    Terminated,
    add_first_hop_argument,
    add_precision_arguments,
    add_speed_method_argument,
    add_watermark_arguments,
    device,
    first_hop_argument,
    flow_cache_budget_arg,
    nonnegative_int,
    port,
    positive_float,
    positive_int,
    precision_arguments,
    speed_method_argument,
    watermark_argument,
)
from cadenza.engine.scheduler_config import FIRST_AUDIO_PAUSES, SchedulerConfig
from cadenza.errors import CadenzaError, MissingDependencyError

log = logging.getLogger(__name__)

API_KEY_ENV = "CADENZA_API_KEY"
ADMIN_KEY_ENV = "CADENZA_ADMIN_KEY"
VOICES_ENV = "CADENZA_VOICES_DIR"
VOICES_DB_ENV = "CADENZA_VOICES_DB"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")


def default_voices_dir() -> Path:
    """``$CADENZA_VOICES_DIR``, else ``$XDG_DATA_HOME/cadenza/voices`` (``~/.local/share/cadenza/voices``)."""
    if os.environ.get(VOICES_ENV):
        return Path(os.environ[VOICES_ENV]).expanduser()
    data_home = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return data_home / "cadenza" / "voices"


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``cadenza`` sub-commands (``subparsers`` from ``add_subparsers``)."""
    p = subparsers.add_parser("serve", help="run the OpenAI-compatible speech server (HTTP + WebSocket)")
    p.add_argument("--model", action="append", default=None, metavar="[NAME=]DIR",
                   help=f"a model directory to serve (CosyVoice 2 or VoxCPM 2, as released) or a hub name "
                   f"(owner/name[@rev], modelscope:owner/name; a local folder of that name wins), optionally named "
                   f"(requests select it by its 'model' field; default name: the folder's). Repeat to serve several; "
                   f"the first is the default. Default ${MODEL_ENV}, else the built-in cadenza-tiny")
    p.add_argument("--lora", action="append", default=[], metavar="[MODEL:]NAME=DIR",
                   help="a LoRA adapter folder (lora_config.json + lora_weights.safetensors) of a served VoxCPM 2 "
                   "model, registered as NAME: requests pick it with model 'MODEL:NAME' or the field lora=NAME, and "
                   "are batched with requests using other adapters or none. MODEL: may be left out when one VoxCPM 2 "
                   "model is served. Repeatable")
    p.add_argument("--device", type=device, default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    add_speed_method_argument(p)
    add_first_hop_argument(p)
    add_precision_arguments(p)
    add_watermark_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' (default ${API_KEY_ENV}; prefer the variable: "
                        "command lines are visible to other users)")
    p.add_argument("--admin-key", default=None,
                   help=f"the operator's key for /v1/admin (voice takedown, audit log; default ${ADMIN_KEY_ENV}; "
                        "without one those endpoints are off)")
    p.add_argument("--max-concurrency", type=positive_int, default=16,
                   help="synthesis requests in flight at once; more get HTTP 429 (default 16)")
    p.add_argument("--max-active", type=positive_int, default=SchedulerConfig.max_active,
                   help="requests the engine decodes together; more wait in its queue (default %(default)s)")
    p.add_argument("--max-queued", type=nonnegative_int, default=SchedulerConfig.max_queued,
                   help="requests waiting for the engine; more get HTTP 429 (default %(default)s)")
    p.add_argument("--vocoder-workers", type=positive_int, default=None,
                   help="flow + HiFT worker threads (default: two from two cores on)")
    p.add_argument("--first-audio-pause", choices=FIRST_AUDIO_PAUSES, default=SchedulerConfig.first_audio_pause,
                   help="when the LM pauses other requests while a first chunk is made: always (fastest first audio) "
                        "or contended (only when cores are short: fewer playback stalls; default %(default)s)")
    p.add_argument("--flow-cache-budget-mb", type=flow_cache_budget_arg, default=SchedulerConfig.flow_cache_budget_mb,
                   help="MiB the streamed flow's caches of all requests may hold together (CosyVoice 2); past it the "
                        "largest are freed and those streams recompute (same audio, slower): a number, 'auto' (half "
                        "the memory free at start) or 'none' (default %(default)s)")
    p.add_argument("--no-stream-batching", dest="batch_streams", action="store_false",
                   help="run every stream's flow and HiFT calls alone instead of batching equal ones across "
                        "requests: a seed then gives the same audio bit for bit whatever else runs (batched, it "
                        "differs by round-off: about -35 dB in bfloat16), for a little less throughput")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch intra-op threads the workers share (default: torch's, usually the cores)")
    p.add_argument("--voices-dir", default=None, help=f"saved voices (default ${VOICES_ENV} or "
                                                      "~/.local/share/cadenza/voices)")
    p.add_argument("--voices-db", default=None, metavar="postgresql://...",
                   help=f"keep saved voices in PostgreSQL instead, shared by server replicas (default ${VOICES_DB_ENV}; "
                        "prefer the variable or PGPASSWORD/~/.pgpass for the password; needs the 'postgres' extra)")
    p.add_argument("--max-upload-mb", type=positive_float, default=10.0,
                   help="largest voice or voice-conversion upload in MiB (default 10)")
    p.add_argument("--max-lora-mb", type=positive_float, default=256.0,
                   help="largest LoRA weights upload (POST /v1/admin/loras) in MiB (default 256)")
    # Defaults of the three below live in ServerConfig (the server package needs its extra: not imported here).
    p.add_argument("--max-conversion-seconds", type=positive_float, default=None,
                   help="longest source recording of POST /v1/audio/voice-conversion, at most 300 (default 240)")
    p.add_argument("--max-audio-seconds", type=positive_float, default=None,
                   help="most audio one request may make; longer inputs are refused with 400 (default 600)")
    p.add_argument("--max-connections", type=positive_int, default=None,
                   help="open connections at most; more get 503 (default 1024)")
    p.add_argument("--allowed-host", action="append", default=None, metavar="HOST",
                   help="a Host name clients may use (repeatable; '*' for any). Default: any with an API key; "
                        "without one, loopback names and --host")
    p.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (https://app.example.com) whose pages may call the server (repeatable; "
                        "'*' for any). Default: only the server's own pages")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="listen at once instead of first speaking a short phrase with each model (the first request "
                        "then waits for the engine's first calls)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run_serve)
    return p


def run_serve(args: argparse.Namespace) -> None:
    """Load the model and serve until interrupted (Ctrl-C / SIGTERM). Raises ``CadenzaError`` on bad settings."""
    try:
        import uvicorn

        from cadenza.server import ServerConfig, create_app
        from cadenza.server.protocol import uvicorn_config
    except ImportError as exc:
        raise MissingDependencyError(f"the server needs the 'server' extra ({exc.name} is missing): "
                                     "pip install 'cadenza[server]'") from exc
    from cadenza.api import load, warm_up
    from cadenza.builtin import resolve_model_path
    from cadenza.server.config import model_name_of
    from cadenza.voices import VoiceStore

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    hosts = args.allowed_host
    if hosts is None and api_key is None:
        hosts = list(LOOPBACK) + ([args.host] if args.host not in WILDCARD_ADDRESSES + LOOPBACK else [])
    audio_s = ServerConfig.max_audio_seconds if args.max_audio_seconds is None else args.max_audio_seconds
    try:
        config = ServerConfig(api_key=api_key, admin_key=args.admin_key or os.environ.get(ADMIN_KEY_ENV) or None,
                              max_concurrency=args.max_concurrency,
                              max_upload_bytes=int(args.max_upload_mb * 2**20), max_audio_seconds=audio_s,
                              max_lora_bytes=int(args.max_lora_mb * 2**20),
                              max_inflight_audio_seconds=max(ServerConfig.max_inflight_audio_seconds, audio_s),
                              max_connections=args.max_connections or ServerConfig.max_connections,
                              max_conversion_seconds=args.max_conversion_seconds or ServerConfig.max_conversion_seconds,
                              allowed_hosts=None if hosts is None else tuple(hosts),
                              allowed_origins=tuple(args.allowed_origin))
    except ValueError as exc:
        raise CadenzaError(f"bad server setting: {exc}") from exc
    if api_key is None and args.host not in LOOPBACK:
        log.warning("listening on %s without an API key: anyone who can reach it can use it (set $%s)",
                    args.host, API_KEY_ENV)
        if args.allowed_host is None:
            log.warning("without an API key only the Host names %s are answered: add the names clients use with "
                        "--allowed-host", ", ".join(config.hosts))
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    scheduler = SchedulerConfig(max_active=args.max_active, max_queued=args.max_queued,
                                vocoder_workers=args.vocoder_workers, first_audio_pause=args.first_audio_pause,
                                flow_cache_budget_mb=args.flow_cache_budget_mb, batch_streams=args.batch_streams)
    specs = model_specs(args.model or ([os.environ[MODEL_ENV]] if os.environ.get(MODEL_ENV) else [None]))
    models: dict = {}
    mark = watermark_argument(args)  # before any model loads: a bad key file fails fast
    # So does the voice store: an unreachable database is an error in seconds, not after the models loaded.
    voices = VoiceStore(voices_location(args), max_audio_bytes=config.max_upload_bytes)
    try:
        for name, path in specs:
            folder = resolve_model_path(path)  # None: the built-in one; a hub name (owner/name[@rev]): downloaded
            precision = precision_arguments(folder, args.dtype, args.lm_int8, args.device, args.flow_int8)
            tts = load(folder, device=args.device, scheduler=scheduler, **precision, **mark,
                       **speed_method_argument(args), **first_hop_argument(args, folder))
            name = name or model_name_of(tts.directory)
            if name in models:
                tts.close()
                raise CadenzaError(f"two models are named {name!r}: name them with --model NAME=DIR")
            models[name] = tts
        register_loras(models, args.lora, config.max_loras)
        for name, tts in models.items():
            warm = f", warmed up in {seconds:.1f} s" if args.warmup and (seconds := warm_up(tts, name)) else ""
            print(f"serving {tts.directory} as {name!r} ({tts.capabilities.title}, {tts.sample_rate} Hz{warm})",
                  file=sys.stderr)
        print(f"on http://{args.host}:{args.port} (voices in {voices.location})", file=sys.stderr)
        server = uvicorn.Server(uvicorn_config(create_app(models, voices, config), config, host=args.host,
                                               port=args.port, log_level=args.log_level))
        try:
            server.run()
        except (KeyboardInterrupt, Terminated):  # Ctrl-C / SIGTERM: uvicorn shut down gracefully, then re-raised it
            pass
    finally:
        for tts in models.values():
            tts.close()
        voices.close()


def voices_location(args: argparse.Namespace) -> str | Path:
    """Where the saved voices live: ``--voices-db``, a ``postgresql://`` URL; else ``--voices-dir``; else
    ``$CADENZA_VOICES_DB``; else the default folder (``default_voices_dir()``). A flag wins over the variables."""
    if args.voices_db and args.voices_dir:
        raise CadenzaError("give --voices-dir (an SQLite folder) or --voices-db (PostgreSQL), not both")
    if args.voices_dir:
        return Path(args.voices_dir).expanduser()
    url = args.voices_db or os.environ.get(VOICES_DB_ENV) or None
    if url is None:
        return default_voices_dir()
    if not url.startswith(("postgresql://", "postgres://")):
        raise CadenzaError("--voices-db takes a postgresql://user@host:port/dbname URL (an SQLite store is a folder: "
                           "--voices-dir)")
    return url


def register_loras(models: dict, values: list[str], max_loras: int) -> None:
    """Register each ``--lora [MODEL:]NAME=DIR`` with its model (``CadenzaError`` naming the bad value)."""
    takers = [name for name, tts in models.items() if callable(getattr(tts, "register_lora", None))]
    for value in values:
        target, sep, path = value.partition("=")
        model, _, name = target.rpartition(":")
        if not sep or not name or not path:
            raise CadenzaError(f"--lora {value!r}: expected [MODEL:]NAME=DIR")
        if not model:
            if len(takers) != 1:
                raise CadenzaError(f"--lora {value!r}: write MODEL:NAME=DIR; "
                                   + ("no served model takes LoRA adapters (VoxCPM 2 models do)" if not takers
                                      else f"several served models take adapters ({', '.join(takers)})"))
            model = takers[0]
        if model not in takers:
            raise CadenzaError(f"--lora {value!r}: {model!r} is not a served VoxCPM 2 model (served: "
                               f"{', '.join(models)})")
        if len(models[model].loras) >= max_loras:
            raise CadenzaError(f"--lora {value!r}: model {model!r} would hold more than {max_loras} adapters")
        models[model].register_lora(name, path)
        print(f"LoRA adapter {path} as {model}:{name}", file=sys.stderr)


def model_specs(values: list[str | None]) -> list[tuple[str | None, str | None]]:
    """``--model`` values -> (name or None, directory or None). ``NAME=DIR`` names a model when NAME is a valid
    model name (letters, digits, ``.``, ``_``, ``-``); anything else is a directory."""
    from cadenza.server.config import valid_model_name

    specs = []
    for value in values:
        if value is not None and "=" in value:
            name, _, path = value.partition("=")
            if valid_model_name(name) and path:
                specs.append((name, path))
                continue
        specs.append((None, value))
    return specs
