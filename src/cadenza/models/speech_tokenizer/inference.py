"""Run, save and load a trained speech tokenizer (a drop-in replacement for ``speech_tokenizer_v2.onnx``).

On disk (a model directory may hold these instead of the ONNX file)::

    speech_tokenizer.safetensors   SpeechTokenizerModel.state_dict() (float32)
    speech_tokenizer.json          {"format": "cadenza.speech_tokenizer", "version": 1, "config": {...},
                                    "metadata": {...}}   (metadata: training figures, e.g. codebook utilisation)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cadenza.errors import InputError
from cadenza.loading.bundle import BundleFormat
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
from cadenza.models.speech_tokenizer.model import SpeechTokenizerModel

BUNDLE = BundleFormat("speech_tokenizer", version=1, what="speech tokenizer")
WEIGHTS_NAME = BUNDLE.weights_name
CONFIG_NAME = BUNDLE.config_name
FORMAT = BUNDLE.format
VERSION = BUNDLE.version


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

    @torch.no_grad()  # not inference_mode: the outputs feed requests built outside it
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

    ``metadata`` must be JSON-serialisable (training figures).
    """
    return BUNDLE.save(model.state_dict(), model.cfg.to_dict(), directory, metadata)


def find_speech_tokenizer(directory: str | Path) -> Path | None:
    """``directory / speech_tokenizer.safetensors`` if it and its JSON exist, else None (for model-dir probing)."""
    return BUNDLE.find(directory)


def read_speech_tokenizer_json(path: str | Path) -> dict[str, Any]:
    """Parse and check ``speech_tokenizer.json``; returns the whole document."""
    return BUNDLE.read_json(path)


def load_speech_tokenizer(path: str | Path, device: str | torch.device = "cpu") -> SpeechTokenizer:
    """Load from a directory holding both files, or from the path of either file.

    Raises:
        CheckpointError: missing or unreadable files, an invalid config, or weights that do not match it.
    """
    return SpeechTokenizer(BUNDLE.load_module(path, SpeechTokenizerConfig.from_dict, SpeechTokenizerModel).to(device))
