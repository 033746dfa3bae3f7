"""Typed hyper-parameters of the CAM++-style speaker encoder (stored in ``speaker_encoder.json``).

Defaults follow CAM++ (Wang et al., 2023; the architecture of the release's ``campplus.onnx``): a 2-D conv front end
(FCM) halving the frequency axis ``len(fcm_blocks) + 1`` times, a strided TDNN layer, three densely connected TDNN
blocks with context-aware masking, mean + std pooling and a 192-d embedding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from cadenza.errors import InputError


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise InputError(f"invalid speaker encoder config: {msg}")


def _is_pos_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """Sizes of the speaker encoder.

    Attributes:
        n_mels: fbank bins of the input (80, from ``campplus_features``).
        embedding_size: output x-vector size.
        fcm_channels: channels of the 2-D front end.
        fcm_blocks: residual blocks per front-end stage; every stage (and the final conv) halves the frequency axis.
        tdnn_channels: channels of the first TDNN layer.
        tdnn_kernel, tdnn_stride: its kernel and time stride (2: 100 -> 50 frames/s).
        growth_rate: channels each densely connected layer adds.
        bottleneck_scale: a dense layer's 1x1 bottleneck has ``bottleneck_scale * growth_rate`` channels.
        block_layers, block_kernels, block_dilations: per dense TDNN block (one entry each); after every block a
            transition layer halves the channels.
        cam_reduction: channel reduction of the context-aware mask's hidden layer.
        cam_segment_frames: segment length of the mask's segment-level pooling (frames after the TDNN stride).
    """

    n_mels: int = 80
    embedding_size: int = 192
    fcm_channels: int = 32
    fcm_blocks: tuple[int, ...] = (2, 2)
    tdnn_channels: int = 128
    tdnn_kernel: int = 5
    tdnn_stride: int = 2
    growth_rate: int = 32
    bottleneck_scale: int = 4
    block_layers: tuple[int, ...] = (12, 24, 16)
    block_kernels: tuple[int, ...] = (3, 3, 3)
    block_dilations: tuple[int, ...] = (1, 2, 2)
    cam_reduction: int = 2
    cam_segment_frames: int = 100

    def __post_init__(self) -> None:
        for name in ("n_mels", "embedding_size", "fcm_channels", "tdnn_channels", "tdnn_kernel", "tdnn_stride",
                     "growth_rate", "bottleneck_scale", "cam_reduction", "cam_segment_frames"):
            _check(_is_pos_int(getattr(self, name)), f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("fcm_blocks", "block_layers", "block_kernels", "block_dilations"):
            value = getattr(self, name)
            _check(isinstance(value, tuple) and len(value) > 0 and all(_is_pos_int(v) for v in value),
                   f"{name} must be a non-empty list of positive integers, got {value!r}")
        _check(len(self.block_layers) == len(self.block_kernels) == len(self.block_dilations),
               "block_layers, block_kernels and block_dilations need one entry per block")
        _check(self.tdnn_kernel % 2 == 1 and all(k % 2 == 1 for k in self.block_kernels), "kernels must be odd")
        _check(self.bottleneck_scale * self.growth_rate >= self.cam_reduction,
               "the bottleneck is narrower than cam_reduction")

    @property
    def fcm_out_bins(self) -> int:
        """Frequency bins left after the front end (each stride-2 conv maps F to ceil(F / 2))."""
        bins = self.n_mels
        for _ in range(len(self.fcm_blocks) + 1):
            bins = (bins + 1) // 2
        return bins

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpeakerEncoderConfig:
        """Build from a JSON / YAML mapping; lists become tuples; unknown keys raise ``InputError``."""
        _check(isinstance(data, Mapping), f"the config must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        _check(not unknown, f"unknown keys {unknown}; known keys are {sorted(known)}")
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()})
