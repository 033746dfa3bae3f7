"""Run, save and load a trained speaker encoder (a drop-in replacement for ``campplus.onnx``).

On disk (a model directory may hold these instead of the ONNX file)::

    speaker_encoder.safetensors   SpeakerEncoderModel.state_dict() (float32; BatchNorm running statistics included)
    speaker_encoder.json          {"format": "cadenza.speaker_encoder", "version": 1, "config": {...},
                                   "metadata": {...}}   (metadata: training figures, e.g. EER)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from cadenza.errors import CheckpointError, InputError
from cadenza.loading import load_into
from cadenza.models.speaker_encoder.config import SpeakerEncoderConfig
from cadenza.models.speaker_encoder.model import SpeakerEncoderModel

WEIGHTS_NAME = "speaker_encoder.safetensors"
CONFIG_NAME = "speaker_encoder.json"
FORMAT = "cadenza.speaker_encoder"
VERSION = 1


class SpeakerEncoder:
    """x-vector of a 16 kHz utterance; same call interface as ``CampPlusSpeakerEncoder``.

    Args:
        model: a trained :class:`SpeakerEncoderModel` (put in eval mode here).
    """

    def __init__(self, model: SpeakerEncoderModel) -> None:
        self.model = model.eval()
        self.config = model.cfg

    @torch.inference_mode()
    def __call__(self, fbank: torch.Tensor) -> torch.Tensor:
        """fbank ``[1, frames, n_mels]`` (``campplus_features``: mean-normalised) -> embedding
        ``[1, embedding_size]`` float32 on the CPU."""
        if fbank.dim() == 2:
            fbank = fbank.unsqueeze(0)
        param = next(self.model.parameters())
        out = self.model(fbank.to(device=param.device, dtype=param.dtype))
        return out.float().cpu()


def save_speaker_encoder(model: SpeakerEncoderModel, directory: str | Path,
                         metadata: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Write ``speaker_encoder.safetensors`` + ``speaker_encoder.json`` into ``directory``; returns both paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    # Floating tensors in float32; BatchNorm's integer batch counters stay integers.
    tensors = {k: (v.detach().cpu().float() if v.is_floating_point() else v.detach().cpu()).contiguous()
               for k, v in model.state_dict().items()}
    save_file(tensors, str(d / WEIGHTS_NAME))
    doc = {"format": FORMAT, "version": VERSION, "config": model.cfg.to_dict(), "metadata": metadata or {}}
    (d / CONFIG_NAME).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return d / WEIGHTS_NAME, d / CONFIG_NAME


def find_speaker_encoder(directory: str | Path) -> Path | None:
    """``directory / speaker_encoder.safetensors`` if it and its JSON exist, else None (for model-dir probing)."""
    d = Path(directory)
    return d / WEIGHTS_NAME if (d / WEIGHTS_NAME).is_file() and (d / CONFIG_NAME).is_file() else None


def read_speaker_encoder_json(path: str | Path) -> dict[str, Any]:
    """Parse and check ``speaker_encoder.json``; returns the whole document."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("config"), dict):
        raise CheckpointError(f"{path} is not a cadenza speaker encoder config (format {FORMAT!r} with a config)")
    if doc.get("version") != VERSION:
        raise CheckpointError(f"{path} has version {doc.get('version')!r}; this cadenza reads version {VERSION}")
    return doc


def load_speaker_encoder(path: str | Path, device: str | torch.device = "cpu") -> SpeakerEncoder:
    """Load from a directory holding both files, or from the path of either file.

    Raises:
        CheckpointError: missing or unreadable files, an invalid config, or weights that do not match it.
    """
    path = Path(path).expanduser()
    d = path if path.is_dir() else path.parent
    weights, config = d / WEIGHTS_NAME, d / CONFIG_NAME
    for f in (weights, config):
        if not f.is_file():
            raise CheckpointError(f"speaker encoder file not found: {f}")
    doc = read_speaker_encoder_json(config)
    try:
        cfg = SpeakerEncoderConfig.from_dict(doc["config"])
    except (InputError, TypeError) as exc:
        raise CheckpointError(f"{config}: {exc}") from exc
    try:
        state = load_file(str(weights), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {weights} as safetensors (corrupt or truncated?): {exc}") from exc
    model = SpeakerEncoderModel(cfg)
    load_into(model, state, str(weights))
    return SpeakerEncoder(model.to(device))
