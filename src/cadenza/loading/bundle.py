"""A trained component on disk as two files: ``NAME.safetensors`` (weights) + ``NAME.json`` (format, version, config,
metadata). Used by our own speech tokenizer and speaker encoder, which a model folder may hold instead of the
release's ONNX models."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from cadenza.errors import CheckpointError, InputError
from cadenza.loading.files import check_file, read_json_object
from cadenza.loading.state_dict import load_into

ConfigT = TypeVar("ConfigT")
ModuleT = TypeVar("ModuleT", bound=nn.Module)


@dataclass(frozen=True)
class BundleFormat:
    """File names and the format tag of one kind of bundle, e.g. ``BundleFormat("speaker_encoder", 1, "speaker
    encoder")`` -> ``speaker_encoder.safetensors`` + ``speaker_encoder.json`` with format ``cadenza.speaker_encoder``."""

    name: str
    version: int
    what: str  # for messages

    @property
    def weights_name(self) -> str:
        return f"{self.name}.safetensors"

    @property
    def config_name(self) -> str:
        return f"{self.name}.json"

    @property
    def format(self) -> str:
        return f"cadenza.{self.name}"

    def save(self, state_dict: dict[str, torch.Tensor], config: dict[str, Any], directory: str | Path,
             metadata: dict[str, Any] | None = None) -> tuple[Path, Path]:
        """Write both files into ``directory`` (created if needed); weights as contiguous float32 on the CPU."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in state_dict.items()}
        save_file(tensors, str(d / self.weights_name))
        doc = {"format": self.format, "version": self.version, "config": config, "metadata": metadata or {}}
        (d / self.config_name).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return d / self.weights_name, d / self.config_name

    def find(self, directory: str | Path) -> Path | None:
        """The weights path if both files exist in ``directory``, else None (for model-folder probing)."""
        d = Path(directory)
        return d / self.weights_name if (d / self.weights_name).is_file() and (d / self.config_name).is_file() else None

    def read_json(self, path: str | Path) -> dict[str, Any]:
        """Parse and check the JSON document (format, version, a ``config`` object, an optional ``metadata``
        object); the config's own fields are checked by the component's config class."""
        path = Path(path)
        doc = read_json_object(path, self.config_name)
        if doc.get("format") != self.format or not isinstance(doc.get("config"), dict):
            raise CheckpointError(f"{path} is not a cadenza {self.what} config (format {self.format!r} with a config)")
        version = doc.get("version")
        if version != self.version or isinstance(version, bool):
            raise CheckpointError(f"{path} has version {version!r}; this cadenza reads version {self.version}")
        if not isinstance(doc.get("metadata", {}), dict):
            raise CheckpointError(f"{path}: metadata must be a JSON object, got {type(doc['metadata']).__name__}")
        return doc

    def read(self, path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], Path]:
        """(JSON document, weights, weights path) from a directory holding both files or the path of either."""
        path = Path(path).expanduser()
        if not path.exists():  # not "<parent>/<weights> not found": the path the caller gave is what is missing
            raise CheckpointError(f"{self.what} not found: {path} (a folder holding {self.weights_name} and "
                                  f"{self.config_name}, or the path of either)")
        d = path if path.is_dir() else path.parent
        weights, config = d / self.weights_name, d / self.config_name
        for f in (weights, config):
            check_file(f, f"{self.what} file {f.name}")
        doc = self.read_json(config)
        try:
            state = load_file(str(weights), device="cpu")
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own and builtin types for a bad file
            raise CheckpointError(f"cannot read {weights} as safetensors (corrupt or truncated?): {exc}") from exc
        return doc, state, weights

    def load_module(self, path: str | Path, config_from_dict: Callable[[dict[str, Any]], ConfigT],
                    build: Callable[[ConfigT], ModuleT]) -> ModuleT:
        """``build(config_from_dict(doc["config"]))`` with the bundle's weights loaded strictly (on the CPU).

        Raises:
            CheckpointError: missing or unreadable files, a config its class refuses, or weights that do not fit.
        """
        doc, state, weights = self.read(path)
        try:
            cfg = config_from_dict(doc["config"])
        except (InputError, TypeError) as exc:
            raise CheckpointError(f"{weights.with_suffix('.json')}: {exc}") from exc
        module = build(cfg)
        load_into(module, state, str(weights))
        return module
