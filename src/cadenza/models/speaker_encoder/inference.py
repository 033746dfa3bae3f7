"""Run, save and load a trained speaker encoder (a drop-in replacement for ``campplus.onnx``).

On disk (a model directory may hold these instead of the ONNX file)::

    speaker_encoder.safetensors   SpeakerEncoderModel.state_dict() (float32; BatchNorm running statistics included)
    speaker_encoder.json          {"format": "cadenza.speaker_encoder", "version": 1, "config": {...},
                                   "metadata": {...}}   (metadata: training figures, e.g. EER)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cadenza.loading.bundle import BundleFormat
from cadenza.models.speaker_encoder.config import SpeakerEncoderConfig
from cadenza.models.speaker_encoder.model import SpeakerEncoderModel

BUNDLE = BundleFormat("speaker_encoder", version=1, what="speaker encoder")
WEIGHTS_NAME = BUNDLE.weights_name
CONFIG_NAME = BUNDLE.config_name
FORMAT = BUNDLE.format
VERSION = BUNDLE.version


class SpeakerEncoder:
    """x-vector of a 16 kHz utterance; same call interface as ``CampPlusSpeakerEncoder``.

    Args:
        model: a trained :class:`SpeakerEncoderModel` (put in eval mode here).
    """

    def __init__(self, model: SpeakerEncoderModel) -> None:
        self.model = model.eval()
        self.config = model.cfg

    @torch.no_grad()  # not inference_mode: the outputs feed requests built outside it
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
    """Write ``speaker_encoder.safetensors`` + ``speaker_encoder.json`` into ``directory`` (created if needed).

    ``metadata`` must be JSON-serialisable (training figures).
    """
    return BUNDLE.save(model.state_dict(), model.cfg.to_dict(), directory, metadata)


def find_speaker_encoder(directory: str | Path) -> Path | None:
    """``directory / speaker_encoder.safetensors`` if it and its JSON exist, else None (for model-dir probing)."""
    return BUNDLE.find(directory)


def read_speaker_encoder_json(path: str | Path) -> dict[str, Any]:
    """Parse and check ``speaker_encoder.json``; returns the whole document."""
    return BUNDLE.read_json(path)


def load_speaker_encoder(path: str | Path, device: str | torch.device = "cpu") -> SpeakerEncoder:
    """Load from a directory holding both files, or from the path of either file.

    Raises:
        CheckpointError: missing or unreadable files, an invalid config, or weights that do not match it.
    """
    return SpeakerEncoder(BUNDLE.load_module(path, SpeakerEncoderConfig.from_dict, SpeakerEncoderModel).to(device))
