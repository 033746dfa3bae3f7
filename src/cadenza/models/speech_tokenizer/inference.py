"""Run, save and load a trained speech tokenizer (a drop-in replacement for ``speech_tokenizer_v2.onnx``).

On disk (a model directory may hold these instead of the ONNX file)::

    speech_tokenizer.safetensors   SpeechTokenizerModel.state_dict() (float32)
    speech_tokenizer.json          {"format": "cadenza.speech_tokenizer", "version": 1, "config": {...},
                                    "metadata": {...}}   (metadata: training figures, e.g. codebook utilisation)
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
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
from cadenza.models.speech_tokenizer.model import SpeechTokenizerModel

WEIGHTS_NAME = "speech_tokenizer.safetensors"
CONFIG_NAME = "speech_tokenizer.json"
FORMAT = "cadenza.speech_tokenizer"
VERSION = 1


class SpeechTokenizer:
    """25 Hz speech token ids of a 16 kHz utterance; same call interface as ``OnnxSpeechTokenizer``.

    Args:
        model: a trained :class:`SpeechTokenizerModel` (put in eval mode here).
    """

    def __init__(self, model: SpeechTokenizerModel) -> None:
        self.model = model.eval()
        self.config = model.cfg
        self.max_seconds = model.cfg.max_seconds
        self.codebook_size = model.cfg.codebook_size

    @torch.inference_mode()
    def __call__(self, log_mel: torch.Tensor) -> torch.Tensor:
        """log_mel ``[1, n_mels, frames]`` (whisper log-mel, 100 frames/s) -> ids ``[1, frames // 4]`` int64 on the
        CPU (the divisor is the config's ``downsample``). A batch of equal-length utterances also works."""
        if log_mel.dim() != 3:
            raise InputError(f"log-mel must be [1, {self.config.n_mels}, frames], got {tuple(log_mel.shape)}")
        param = next(self.model.parameters())
        ids = self.model(log_mel.to(device=param.device, dtype=param.dtype))
        return ids.cpu().to(torch.int64)


def save_speech_tokenizer(model: SpeechTokenizerModel, directory: str | Path,
                          metadata: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Write ``speech_tokenizer.safetensors`` + ``speech_tokenizer.json`` into ``directory`` (created if needed).

    Returns the two paths. ``metadata`` must be JSON-serialisable (e.g. ``{"codebook_utilization": 0.97}``).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(d / WEIGHTS_NAME))
    doc = {"format": FORMAT, "version": VERSION, "config": model.cfg.to_dict(), "metadata": metadata or {}}
    (d / CONFIG_NAME).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return d / WEIGHTS_NAME, d / CONFIG_NAME


def find_speech_tokenizer(directory: str | Path) -> Path | None:
    """``directory / speech_tokenizer.safetensors`` if it and its JSON exist, else None (for model-dir probing)."""
    d = Path(directory)
    return d / WEIGHTS_NAME if (d / WEIGHTS_NAME).is_file() and (d / CONFIG_NAME).is_file() else None


def read_speech_tokenizer_json(path: str | Path) -> dict[str, Any]:
    """Parse and check ``speech_tokenizer.json``; returns the whole document."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("config"), dict):
        raise CheckpointError(f"{path} is not a cadenza speech tokenizer config (format {FORMAT!r} with a config)")
    if doc.get("version") != VERSION:
        raise CheckpointError(f"{path} has version {doc.get('version')!r}; this cadenza reads version {VERSION}")
    return doc


def load_speech_tokenizer(path: str | Path, device: str | torch.device = "cpu") -> SpeechTokenizer:
    """Load a tokenizer from a directory holding both files, or from the path of either file.

    Raises:
        CheckpointError: missing or unreadable files, an invalid config, or weights that do not match it.
    """
    path = Path(path).expanduser()
    d = path if path.is_dir() else path.parent
    weights, config = d / WEIGHTS_NAME, d / CONFIG_NAME
    for f in (weights, config):
        if not f.is_file():
            raise CheckpointError(f"speech tokenizer file not found: {f}")
    doc = read_speech_tokenizer_json(config)
    try:
        cfg = SpeechTokenizerConfig.from_dict(doc["config"])
    except (InputError, TypeError) as exc:
        raise CheckpointError(f"{config}: {exc}") from exc
    try:
        state = load_file(str(weights), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {weights} as safetensors (corrupt or truncated?): {exc}") from exc
    model = SpeechTokenizerModel(cfg)
    load_into(model, state, str(weights))
    return SpeechTokenizer(model.to(device))
