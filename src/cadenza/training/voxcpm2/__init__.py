"""VoxCPM 2 fine-tuning pieces: the sequence packer and the diffusion + stop losses.

See docs/design.md, "VoxCPM 2 training".
"""

from cadenza.training.voxcpm2.losses import (
    ItemNoise,
    LossOutput,
    TrainingNoise,
    flow_matching_loss,
    voxcpm2_losses,
)
from cadenza.training.voxcpm2.packer import EncodedSample, PackedBatch, TrainingSample, VoxCPM2Packer

__all__ = [
    "EncodedSample", "ItemNoise", "LossOutput", "PackedBatch", "TrainingNoise", "TrainingSample", "VoxCPM2Packer",
    "flow_matching_loss", "voxcpm2_losses",
]
