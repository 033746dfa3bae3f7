"""LoRA adapters of served VoxCPM 2 models, added and removed while the server runs (behind the admin key).

``POST /v1/admin/loras`` takes a multipart form: ``name`` (1-64 letters, digits, ``.``, ``_``, ``-``), ``model``
(the served VoxCPM 2 model; optional when only one is served), ``config`` (the trainer's ``lora_config.json``, at
most 64 KiB) and ``weights`` (``lora_weights.safetensors``, at most ``max_lora_bytes``; safetensors only, never a
pickle). The adapter is checked against the model's layers (strict keys, shapes, finite values) and registered in
memory: requests then pick it with ``model: "<model>:<name>"`` or ``lora: "<name>"``. It lasts until the server
stops (``cadenza serve --lora`` loads adapters at start). ``DELETE /v1/admin/loras/{model}:{name}`` (or ``{name}``
with one VoxCPM 2 model) removes one unless requests that use it are running (409). See docs/server.md, "LoRA
adapters".
"""

from __future__ import annotations

import json
import threading

import anyio
import torch
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile

from cadenza.errors import CheckpointError, LoRAInUseError, UnknownLoRAError
from cadenza.models.voxcpm2.lora import LoRAConfig
from cadenza.models.voxcpm2.lora_bank import valid_lora_name
from cadenza.server.auth import require_admin_key
from cadenza.server.errors import APIError
from cadenza.server.multipart import read_form
from cadenza.server.state import LORA_SEPARATOR, ServedModel, ServerState

router = APIRouter(dependencies=[Depends(require_admin_key)])
PATH = "/v1/admin/loras"
MAX_CONFIG_BYTES = 64 * 1024
_CHANGES = threading.Lock()  # one registration at a time: the count limit is checked and used atomically


def _model(state: ServerState, name: str | None) -> ServedModel:
    """The served model an adapter is for: ``name``, or the one model that takes adapters."""
    if name is not None:
        served = state.model(name)
        if served.name != name:
            raise APIError(404, f"model {name[:80]!r} is not served here; served: {', '.join(state.models)}",
                           param="model", code="model_not_found")
        if not served.takes_loras:
            raise APIError(400, f"model {name!r} ({served.capabilities.title}) takes no LoRA adapters; VoxCPM 2 "
                           "models do", param="model", code="unsupported_value")
        return served
    takers = [m for m in state.models.values() if m.takes_loras]
    if len(takers) != 1:
        raise APIError(400, "name the model the adapter is for (form field 'model'): " + (
            "no served model takes LoRA adapters" if not takers else
            f"several do ({', '.join(m.name for m in takers)})"), param="model", code="missing_field")
    return takers[0]


def _text(form, name: str) -> str | None:
    value = form.get(name)
    if value is not None and not isinstance(value, str):
        raise APIError(400, f"form field '{name}' must be text, not a file", param=name, code="invalid_value")
    return value


async def _file(form, name: str, limit: int) -> bytes:
    upload = form.get(name)
    if not isinstance(upload, UploadFile):
        raise APIError(400, f"missing the file field '{name}'", param=name, code="missing_field")
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise APIError(413, f"the {name} file is larger than the {limit / 2**20:.2f} MiB limit", param=name,
                       code="file_too_large")
    if not data:
        raise APIError(400, f"the {name} file is empty", param=name, code="invalid_value")
    return data


def _read(config_data: bytes, weights_data: bytes) -> tuple[LoRAConfig, dict[str, torch.Tensor]]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        data = json.loads(config_data.decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        inner = data.get("lora_config", data)
        if not isinstance(inner, dict):
            raise ValueError("lora_config must be a JSON object")
        config = LoRAConfig.from_dict(inner, "config")
    except (ValueError, UnicodeDecodeError, CheckpointError) as exc:
        raise APIError(400, f"config is not a LoRA config (lora_config.json): {exc}", param="config",
                       code="invalid_lora") from exc
    try:
        state = load(weights_data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise APIError(400, f"weights is not a safetensors file: {exc}", param="weights", code="invalid_lora") from exc
    return config, state


def _register(state: ServerState, served: ServedModel, name: str, config_data: bytes, weights_data: bytes) -> dict:
    """Blocking: parse, check and register (waits for the running batched step: adapters change between steps)."""
    config, tensors = _read(config_data, weights_data)
    with _CHANGES:
        if name in served.loras:
            raise APIError(409, f"model {served.name!r} already has a LoRA adapter {name!r}: delete it first",
                           param="name", code="lora_exists")
        if len(served.loras) >= state.config.max_loras:
            raise APIError(409, f"model {served.name!r} already holds {state.config.max_loras} LoRA adapters, the "
                           "most this server allows: delete one first", param="name", code="too_many_loras")
        try:
            adapter = served.tts.register_lora_tensors(name, config, tensors, source="weights")
        except CheckpointError as exc:
            raise APIError(400, str(exc), param="weights", code="invalid_lora") from exc
    return {"object": "lora", "id": f"{served.name}{LORA_SEPARATOR}{name}", "model": served.name, "name": name,
            "r": config.r, "alpha": config.alpha, "parameters": adapter.n_parameters}


@router.post(PATH, status_code=201)
async def upload_lora(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.cadenza
    form = await read_form(request, fields=("name", "model", "config", "weights"), max_files=2, not_multipart="send the adapter as multipart/form-data "
                           "with fields name, config and weights (and model)")
    try:
        name = _text(form, "name")
        if name is None:
            raise APIError(400, "missing form field 'name'", param="name", code="missing_field")
        if not valid_lora_name(name):
            raise APIError(400, f"bad adapter name {name[:80]!r}: 1-64 letters, digits, '.', '_' or '-', starting "
                           "with a letter or digit", param="name", code="invalid_value")
        served = _model(state, _text(form, "model"))
        config_data = await _file(form, "config", MAX_CONFIG_BYTES)
        weights_data = await _file(form, "weights", state.config.max_lora_bytes)
        body = await anyio.to_thread.run_sync(_register, state, served, name, config_data, weights_data,
                                              limiter=state.limiter)
    finally:
        await form.close()
    return JSONResponse(body, status_code=201)


@router.delete(PATH + "/{lora}")
async def delete_lora(lora: str, request: Request) -> JSONResponse:
    state: ServerState = request.app.state.cadenza
    model, _, name = lora.rpartition(LORA_SEPARATOR)
    served = _model(state, model or None)

    def remove() -> None:
        try:
            with _CHANGES:
                served.tts.unregister_lora(name)
        except UnknownLoRAError as exc:
            raise APIError(404, str(exc), param="lora", code="lora_not_found") from exc
        except LoRAInUseError as exc:
            raise APIError(409, str(exc), param="lora", code="lora_in_use") from exc

    await anyio.to_thread.run_sync(remove, limiter=state.limiter)
    return JSONResponse({"object": "lora.deleted", "id": f"{served.name}{LORA_SEPARATOR}{name}", "deleted": True})
