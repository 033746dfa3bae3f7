"""Typed hyper-parameters of VoxCPM 2's AudioVAE V2, read from ``config.json`` (key ``audio_vae_config``).

Every size of ``audio_vae*.py`` comes from :class:`AudioVAEConfig`. As in the reference (a pydantic model with
defaults), a missing ``audio_vae_config`` or missing keys take the release values, and unknown keys are ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cadenza.errors import CheckpointError

# Forward-identical FiLM variants (they differ only in the reference's initialisation).
SUPPORTED_COND_TYPES = ("scale_bias", "scale_bias_init")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckpointError(f"invalid VoxCPM 2 audio_vae_config: {msg}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_ints(name: str, values: object) -> None:
    _check(isinstance(values, tuple) and len(values) > 0 and all(_is_int(v) and v > 0 for v in values),
           f"{name} must be a non-empty list of positive integers, got {values!r}")


@dataclass(frozen=True)
class AudioVAEConfig:
    """AudioVAE V2: causal conv encoder (``sample_rate`` in) and decoder (``out_sample_rate`` out).

    Attributes:
        encoder_dim: channels after the encoder's input conv; doubled by every encoder block.
        encoder_rates: strides of the encoder blocks; their product is the input hop (640).
        latent_dim: latent channels D.
        decoder_dim: channels after the decoder's 1x1 input conv; halved by every decoder block.
        decoder_rates: strides of the decoder's transposed convs; their product is the output hop (1920).
        depthwise: residual-unit dilated convs (and the decoder's first conv) are depthwise.
        sample_rate: encoder input rate (Hz).
        out_sample_rate: decoder output rate (Hz); also the default sample-rate condition.
        use_noise_block: reference option that injects random noise in the decoder (off in the release;
            not supported here).
        sr_bin_boundaries: bucket boundaries of the sample-rate FiLM (``None`` = no FiLM).
        cond_type: FiLM kind; ``scale_bias`` (release) or the forward-identical ``scale_bias_init``.
        cond_dim: only used by the reference's ``concat`` FiLM (kept for completeness).
        cond_out_layer: reference option adding a conv after the FiLM (off in the release; not supported).
    """

    encoder_dim: int = 128
    encoder_rates: tuple[int, ...] = (2, 5, 8, 8)
    latent_dim: int = 64
    decoder_dim: int = 2048
    decoder_rates: tuple[int, ...] = (8, 6, 5, 2, 2, 2)
    depthwise: bool = True
    sample_rate: int = 16000
    out_sample_rate: int = 48000
    use_noise_block: bool = False
    sr_bin_boundaries: tuple[int, ...] | None = (20000, 30000, 40000)
    cond_type: str = "scale_bias"
    cond_dim: int = 128
    cond_out_layer: bool = False

    def __post_init__(self) -> None:
        for name in ("encoder_dim", "latent_dim", "decoder_dim", "sample_rate", "out_sample_rate", "cond_dim"):
            value = getattr(self, name)
            _check(_is_int(value) and value > 0, f"{name} must be a positive integer, got {value!r}")
        _positive_ints("encoder_rates", self.encoder_rates)
        _positive_ints("decoder_rates", self.decoder_rates)
        for name in ("depthwise", "use_noise_block", "cond_out_layer"):
            _check(isinstance(getattr(self, name), bool), f"{name} must be true or false")
        _check(self.decoder_dim % 2 ** len(self.decoder_rates) == 0,
               f"decoder_dim {self.decoder_dim} must be divisible by 2^{len(self.decoder_rates)} (one halving per rate)")
        if self.sr_bin_boundaries is not None:
            _positive_ints("sr_bin_boundaries", self.sr_bin_boundaries)
            _check(list(self.sr_bin_boundaries) == sorted(set(self.sr_bin_boundaries)),
                   f"sr_bin_boundaries must be strictly increasing, got {list(self.sr_bin_boundaries)}")
        _check(not self.use_noise_block,
               "use_noise_block=true is not supported (it draws random noise inside the decoder; the release has it off)")
        _check(self.cond_type in SUPPORTED_COND_TYPES,
               f"cond_type {self.cond_type!r} is not supported (supported: {', '.join(SUPPORTED_COND_TYPES)})")
        _check(not self.cond_out_layer, "cond_out_layer=true is not supported (the release has it off)")
        # Latent frames must mean the same duration on both sides, or decode(encode(x)) changes the length.
        _check(self.sample_rate * self.decode_hop_length == self.out_sample_rate * self.hop_length,
               f"rates disagree: {self.sample_rate} Hz / hop {self.hop_length} != "
               f"{self.out_sample_rate} Hz / hop {self.decode_hop_length}")

    # ---------------------------------------------------------------- derived sizes

    @property
    def hop_length(self) -> int:
        """Input samples per latent frame (640 for the release)."""
        return math.prod(self.encoder_rates)

    @property
    def decode_hop_length(self) -> int:
        """Output samples per latent frame (1920 for the release)."""
        return math.prod(self.decoder_rates)

    @property
    def encoder_out_dim(self) -> int:
        """Channels entering ``fc_mu`` (2048 for the release)."""
        return self.encoder_dim * 2 ** len(self.encoder_rates)

    @property
    def decoder_out_dim(self) -> int:
        """Channels before the output conv (32 for the release)."""
        return self.decoder_dim // 2 ** len(self.decoder_rates)

    @property
    def frame_rate(self) -> float:
        """Latent frames per second (25 for the release)."""
        return self.sample_rate / self.hop_length

    # ---------------------------------------------------------------- construction

    @classmethod
    def official(cls) -> AudioVAEConfig:
        """The released VoxCPM2 AudioVAE hyper-parameters (spec §b.1)."""
        return cls()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, source: str = "audio_vae_config") -> AudioVAEConfig:
        """Build from the ``audio_vae_config`` mapping; absent keys take the release values, unknown keys are ignored.

        ``latent_dim: null`` means ``encoder_dim * 2^len(encoder_rates)`` as in the reference.
        """
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise CheckpointError(f"{source}: audio_vae_config must be an object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                continue
            if key in ("encoder_rates", "decoder_rates", "sr_bin_boundaries") and isinstance(value, list):
                value = tuple(value)
            kwargs[key] = value
        if "latent_dim" in kwargs and kwargs["latent_dim"] is None:
            enc_dim = kwargs.get("encoder_dim", cls.encoder_dim)
            rates = kwargs.get("encoder_rates", cls.encoder_rates)
            kwargs["latent_dim"] = enc_dim * 2 ** len(rates) if _is_int(enc_dim) and isinstance(rates, tuple) else None
        try:
            return cls(**kwargs)
        except CheckpointError as exc:
            raise CheckpointError(f"{source}: {exc}") from None

    @classmethod
    def from_model_config(cls, config: Mapping[str, Any], source: str = "config.json") -> AudioVAEConfig:
        """Read ``audio_vae_config`` from a parsed VoxCPM ``config.json`` (release defaults when absent)."""
        return cls.from_dict(config.get("audio_vae_config"), source=source)

    @classmethod
    def from_json(cls, path: str | Path) -> AudioVAEConfig:
        """Read the ``audio_vae_config`` of a VoxCPM ``config.json`` file."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"cannot read VoxCPM config {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise CheckpointError(f"{path} does not hold a JSON object")
        return cls.from_model_config(data, source=str(path))
