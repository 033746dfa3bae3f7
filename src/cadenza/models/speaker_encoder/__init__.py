"""Trainable CAM++-style speaker encoder: mean-normalised Kaldi fbank -> x-vector (replaces ``campplus.onnx``).

Inference only (no training imports); training lives in ``cadenza.training.speaker_encoder_stage``.
"""

from cadenza.models.speaker_encoder.config import SpeakerEncoderConfig
from cadenza.models.speaker_encoder.inference import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    SpeakerEncoder,
    find_speaker_encoder,
    load_speaker_encoder,
    save_speaker_encoder,
)
from cadenza.models.speaker_encoder.model import SpeakerEncoderModel

__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "SpeakerEncoder",
    "SpeakerEncoderConfig",
    "SpeakerEncoderModel",
    "find_speaker_encoder",
    "load_speaker_encoder",
    "save_speaker_encoder",
]
