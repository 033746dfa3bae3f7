"""Many LoRA adapters on one VoxCPM 2 model at once, chosen per batch row (multi-LoRA serving).

See docs/voxcpm2.md, "Serving several LoRA adapters".

``LoRABank`` keeps named adapters beside the model without touching its weights: each target ``nn.Linear`` (or
model-wide ``LoRALinear``) gets a forward hook that adds, for every row ``i`` of the batch,
``(x_i A_{k_i}ᵀ) B_{k_i}ᵀ · alpha_{k_i} / r_{k_i}`` where ``k_i`` is the adapter of that row's request (none: nothing
is added). The rows of each adapter are gathered and take one pair of matrix products with that adapter's own
tensors, then are added back in place (the segmented SGMV scheme of Punica / S-LoRA, in plain torch; when every row
uses one adapter nothing is gathered). Requests with different adapters, and without one, therefore share one
batched step; adapters may differ in rank, alpha and target layers.

Which adapter each row uses is set around a model call by ``lora_rows(adapters)`` (one entry per batch row; a
context variable, so each scheduler worker thread sets its own). Inside, a layer whose input has ``m·B`` rows for
``B`` entries treats them as ``m`` stacked copies of the batch (the flow sampler's ``[conditional; unconditional]``
doubling). Outside any ``lora_rows`` the hooks add nothing: the base model runs unchanged.

Adding or removing an adapter changes the layers' tables: do it while no step runs (``VoxCPM2Engine.register_lora`` holds
the scheduler's steps back). Per-row application computes what the model-wide ``LoRALinear`` of the same adapter
does, with the same operations; results differ from it by float rounding only where a product sees another number of
rows (as batching does anyway).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.errors import CheckpointError, UnknownLoRAError
from cadenza.loading.state_dict import key_listing
from cadenza.models.voxcpm2.lora import LoRAConfig, LoRALinear, lora_targets, read_lora_checkpoint

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_ADAPTERS = 64


def valid_lora_name(name: object) -> bool:
    """1-64 letters, digits, ``.``, ``_`` or ``-``, starting with a letter or digit."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


@dataclass(eq=False)
class BankedLoRA:
    """One registered adapter. A request holds this object; ``registered`` turns False when it is removed."""

    name: str
    config: LoRAConfig
    layers: tuple[str, ...]  # the target layers' qualified names
    n_parameters: int
    registered: bool = True
    bank: LoRABank | None = field(default=None, repr=False)


@dataclass(frozen=True)
class _Rows:
    """The adapters of a batch: ``names[i]`` for row ``i`` (None = no adapter)."""

    bank: LoRABank
    names: tuple[str | None, ...]


_ROWS: ContextVar[_Rows | None] = ContextVar("cadenza_voxcpm2_lora_rows", default=None)


@contextmanager
def lora_rows(adapters: Sequence[BankedLoRA | None]) -> Iterator[None]:
    """Model calls inside use ``adapters[i]`` for batch row ``i`` (see the module docstring). All rows without an
    adapter: nothing is set, the model runs as it is."""
    banks = {id(a.bank): a.bank for a in adapters if a is not None}
    if not banks:
        yield
        return
    if len(banks) > 1:
        raise ValueError("the adapters of one batch must come from one model's bank")
    token = _ROWS.set(_Rows(next(iter(banks.values())), tuple(None if a is None else a.name for a in adapters)))
    try:
        yield
    finally:
        _ROWS.reset(token)


class LoRABank:
    """Named adapters of one ``VoxCPM2Model``, applied per row (``lora_rows``). Holds at most ``max_adapters``."""

    def __init__(self, model: nn.Module, max_adapters: int = MAX_ADAPTERS) -> None:
        self.model = model
        self.max_adapters = max_adapters
        self._adapters: dict[str, BankedLoRA] = {}
        self._weights: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}  # name -> layer -> (A, B)
        self._layers: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}  # layer -> A, B, scale
        self._hooks: dict[str, torch.utils.hooks.RemovableHandle] = {}

    # -- registry ------------------------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._adapters)

    def __len__(self) -> int:
        return len(self._adapters)

    def __contains__(self, name: object) -> bool:
        return name in self._adapters

    def get(self, name: str) -> BankedLoRA:
        """The adapter ``name``; ``UnknownLoRAError`` listing the registered ones."""
        try:
            return self._adapters[name]
        except (KeyError, TypeError):
            known = ", ".join(self._adapters) or "none"
            raise UnknownLoRAError(f"no LoRA adapter {str(name)[:80]!r} on this model; registered: {known}") from None

    def add_folder(self, name: str, path: str | Path) -> BankedLoRA:
        """Register a checkpoint folder (``lora_config.json`` + ``lora_weights.safetensors``) as ``name``."""
        config, state, weights = read_lora_checkpoint(path)
        if config is None:
            raise CheckpointError(f"{path}: no lora_config.json next to the weights")
        return self.add(name, config, state, source=str(weights))

    @torch.no_grad()
    def add(self, name: str, config: LoRAConfig, state: Mapping[str, torch.Tensor],
            source: str = "LoRA weights") -> BankedLoRA:
        """Register adapter tensors (``<layer>.lora_A`` ``[r, in]`` / ``<layer>.lora_B`` ``[out, r]``, the release's
        names) under ``name``. Strict: unknown, missing, mis-shaped or non-finite tensors raise ``CheckpointError``."""
        if not valid_lora_name(name):
            raise CheckpointError(f"bad LoRA adapter name {str(name)[:80]!r}: 1-64 letters, digits, '.', '_' or '-'")
        if name in self._adapters:
            raise CheckpointError(f"a LoRA adapter named {name!r} is already registered (remove it first)")
        if len(self._adapters) >= self.max_adapters:
            raise CheckpointError(f"this model already holds {self.max_adapters} LoRA adapters, the most allowed")
        layers = lora_targets(self.model, config)
        if not layers:
            raise CheckpointError(f"{source}: the LoRA config selects no layer (enable_lm / enable_dit / enable_proj "
                                  "are all off?)")
        expected = {}
        for layer in layers:
            module = self.model.get_submodule(layer)
            expected[f"{layer}.lora_A"] = (config.r, module.in_features)
            expected[f"{layer}.lora_B"] = (module.out_features, config.r)
        unknown, missing = state.keys() - expected.keys(), expected.keys() - state.keys()
        mismatched = [f"{k} {tuple(state[k].shape)} != {expected[k]}" for k in expected.keys() & state.keys()
                      if tuple(state[k].shape) != expected[k]]
        if unknown or missing or mismatched:
            raise CheckpointError(f"{source} does not match this model's layers for its LoRA config"
                                  + key_listing("unknown LoRA keys", unknown) + key_listing("missing LoRA keys", missing)
                                  + key_listing("shape mismatches (checkpoint != model)", mismatched))
        bad = sorted(k for k, v in state.items() if not v.is_floating_point() or not torch.isfinite(v).all())
        if bad:
            raise CheckpointError(f"{source}: tensors that are not finite floating-point numbers" + key_listing("tensors", bad))
        weight = self.model.get_submodule(layers[0]).weight
        self._weights[name] = {layer: tuple(state[f"{layer}.lora_{p}"].to(device=weight.device, dtype=weight.dtype)
                                            for p in ("A", "B")) for layer in layers}
        adapter = BankedLoRA(name, config, tuple(layers), sum(v.numel() for v in state.values()), bank=self)
        self._adapters[name] = adapter
        self._rebuild(layers)
        return adapter

    def remove(self, name: str) -> BankedLoRA:
        """Unregister ``name`` (its requests must have ended: ``VoxCPM2Engine.unregister_lora`` checks)."""
        adapter = self.get(name)
        del self._adapters[name]
        del self._weights[name]
        adapter.registered = False
        self._rebuild(adapter.layers)
        return adapter

    # -- per-row application -------------------------------------------------------------------------------------
    def _rebuild(self, layers: Sequence[str]) -> None:
        for layer in layers:
            owners = {n: self._weights[n][layer] for n in self._adapters if layer in self._weights[n]}
            if not owners:
                self._layers.pop(layer, None)
                self._hooks.pop(layer).remove()
                continue
            w = self.model.get_submodule(layer).weight
            # The factor as a 0-dim tensor in the model dtype, as LoRALinear's buffer: in bf16 it rounds the same way
            self._layers[layer] = {n: (a, b, torch.tensor(self._adapters[n].config.scaling, dtype=w.dtype,
                                                          device=w.device)) for n, (a, b) in owners.items()}
            if layer not in self._hooks:
                self._hooks[layer] = self.model.get_submodule(layer).register_forward_hook(self._hook(layer))

    def _hook(self, layer: str):
        def add_rows(module: nn.Linear | LoRALinear, inputs: tuple[torch.Tensor, ...], out: torch.Tensor):
            rows = _ROWS.get()
            if rows is None or rows.bank is not self:
                return None
            return self._apply(self._layers[layer], inputs[0], out, rows.names, layer)

        return add_rows

    @staticmethod
    def _apply(adapters: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], x: torch.Tensor,
               out: torch.Tensor, names: tuple[str | None, ...], layer: str) -> torch.Tensor | None:
        """``out`` ``[N, ..., out]`` plus each row's adapter on ``x`` ``[N, ..., in]`` (N = m·len(names)): the rows
        of one adapter together, ``(x Aᵀ) Bᵀ · scale`` as ``LoRALinear`` computes it."""
        n, b = x.shape[0], len(names)
        if n % b:
            raise RuntimeError(f"{layer}: a batch of {n} rows for {b} LoRA row selections")
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(names * (n // b)):
            if name in adapters:  # None, or an adapter without this layer: nothing to add
                groups.setdefault(name, []).append(i)
        if not groups:
            return None
        if len(groups) == 1 and len(next(iter(groups.values()))) == n:  # every row, one adapter: no gather
            a, b_, scale = adapters[next(iter(groups))]
            return out + F.linear(F.linear(x, a), b_) * scale
        out = out.clone()
        for name, rows in groups.items():
            a, b_, scale = adapters[name]
            index = torch.tensor(rows, device=x.device)
            out.index_add_(0, index, F.linear(F.linear(x.index_select(0, index), a), b_) * scale)
        return out
