"""Typed hyper-parameters of VoxCPM 2's AudioVAE V2, read from ``config.json`` (key ``audio_vae_config``).

Every size of ``audio_vae*.py`` comes from :class:`AudioVAEConfig`. As in the reference (a pydantic model with
defaults), a missing ``audio_vae_config`` or missing keys take the release values, and unknown keys are ignored.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cadenza.errors import CheckpointError
from cadenza.models.voxcpm2.config_values import coerce

# The reference's sample-rate conditioning kinds (``SampleRateConditionLayer``); any other name fails there.
COND_TYPES = ("scale_bias", "scale_bias_init", "add", "concat")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckpointError(f"invalid VoxCPM 2 audio_vae_config: {msg}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(name: str, values: object, minimum: int | None = None, nonempty: bool = False) -> None:
    _check(isinstance(values, tuple) and all(_is_int(v) and (minimum is None or v >= minimum) for v in values),
           f"{name} must be a list of integers{'' if minimum is None else f' >= {minimum}'}, got {values!r}")
    _check(not nonempty or len(values) > 0, f"{name} must not be empty")


@dataclass(frozen=True)
class AudioVAEConfig:
    """AudioVAE V2: causal conv encoder (``sample_rate`` in) and decoder (``out_sample_rate`` out).

    Attributes:
        encoder_dim: channels after the encoder's input conv; doubled by every encoder block.
        encoder_rates: strides of the encoder blocks; their product is the input hop (640).
        latent_dim: latent channels D.
        decoder_dim: channels after the decoder's 1x1 input conv. Block ``i`` maps ``decoder_dim // 2^i`` to
            ``decoder_dim // 2^(i+1)`` channels (floor division, as the reference: 160 -> 80 ... 5 -> 2).
        decoder_rates: strides of the decoder's transposed convs; their product is the output hop (1920).
        depthwise: residual-unit dilated convs (and the decoder's first conv) are depthwise.
        sample_rate: encoder input rate (Hz).
        out_sample_rate: decoder output rate (Hz); also the default sample-rate condition. As in the reference it
            is a label: nothing ties it to the hops (the release's 16 kHz / 640 = 48 kHz / 1920 = 25 Hz).
        use_noise_block: reference option that injects random noise in the decoder (off in the release;
            not supported here: see ``__post_init__``).
        sr_bin_boundaries: bucket boundaries of the sample-rate FiLM (``None`` = no FiLM; ``[]`` = one bucket).
        cond_type: FiLM kind (``audio_vae_blocks.SampleRateFiLM``): ``scale_bias`` (release), the
            forward-identical ``scale_bias_init``, ``add`` or ``concat``.
        cond_dim: channels of the ``concat`` condition.
        cond_out_layer: snake + 1x1 conv after the FiLM (off in the release; required by ``concat``).
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
        # Convs need at least one channel (the reference fails building zero-channel depthwise convs).
        for name in ("encoder_dim", "latent_dim"):
            value = getattr(self, name)
            _check(_is_int(value) and value >= 1, f"{name} must be an integer >= 1, got {value!r}")
        # An audio rate must be positive: it labels the output and drives resampling of prompt audio. (The reference
        # builds a model with a rate of 0 and only fails when it loads audio at that rate; no file can carry it.)
        for name in ("sample_rate", "out_sample_rate"):
            value = getattr(self, name)
            _check(_is_int(value) and value >= 1, f"{name} must be an integer >= 1 (Hz), got {value!r}")
        _check(_is_int(self.cond_dim), f"cond_dim must be an integer, got {self.cond_dim!r}")
        # Strides of 0 do not exist. No encoder block is a valid (hop 1) encoder: the reference builds it and runs
        # zero-shot, but its encode then crashes (np.prod([]) is a float pad width), a bug we do not reproduce.
        # The decoder needs a block (the reference's decoder fails to build without one).
        _ints("encoder_rates", self.encoder_rates, minimum=1)
        _ints("decoder_rates", self.decoder_rates, minimum=1, nonempty=True)
        for name in ("depthwise", "use_noise_block", "cond_out_layer"):
            _check(isinstance(getattr(self, name), bool), f"{name} must be true or false")
        _check(_is_int(self.decoder_dim) and self.decoder_out_dim >= 1,
               f"decoder_dim must be an integer >= 2^{len(self.decoder_rates)} = {2 ** len(self.decoder_rates)} "
               f"(the last of the {len(self.decoder_rates)} decoder blocks has decoder_dim // "
               f"2^{len(self.decoder_rates)} channels), got {self.decoder_dim!r}")
        if self.sr_bin_boundaries is not None:
            # Any integers: torch.bucketize (ours and the reference's) takes them as they are.
            _ints("sr_bin_boundaries", self.sr_bin_boundaries)
        # Not a constraint of the reference but a gap of ours: its noise block draws from the global RNG inside
        # every decode, so matching it needs the request's generator threaded through each decoder call.
        _check(not self.use_noise_block,
               "use_noise_block=true is not supported by Cadenza (the reference draws random noise inside the "
               "decoder; the release has it off)")
        _check(self.cond_type in COND_TYPES, f"cond_type must be one of {', '.join(COND_TYPES)} (the reference "
                                             f"refuses others), got {self.cond_type!r}")
        # The reference asserts this: a concatenated condition must be projected back to the block's width.
        _check(self.cond_type != "concat" or self.cond_out_layer, "cond_type 'concat' needs cond_out_layer=true")
        _check(self.cond_type != "concat" or self.cond_dim >= 0, f"cond_dim must be >= 0, got {self.cond_dim}")

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

    def decoder_channels(self, block: int) -> int:
        """Input channels of decoder block ``block`` (``decoder_dim // 2^block``; ``block = len(rates)``: the output
        conv's input)."""
        return self.decoder_dim // 2**block

    @property
    def decoder_out_dim(self) -> int:
        """Channels before the output conv (32 for the release)."""
        return self.decoder_channels(len(self.decoder_rates))

    @property
    def frame_rate(self) -> float:
        """Latent frames per second (25 for the release)."""
        return self.sample_rate / self.hop_length

    # ---------------------------------------------------------------- construction

    @classmethod
    def official(cls) -> AudioVAEConfig:
        """The released VoxCPM2 AudioVAE hyper-parameters (docs/design.md, "VoxCPM 2 AudioVAE")."""
        return cls()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, source: str = "audio_vae_config") -> AudioVAEConfig:
        """Build from the ``audio_vae_config`` mapping; absent keys take the release values, unknown keys are ignored.

        ``latent_dim: null`` means ``encoder_dim * 2^len(encoder_rates)`` as in the reference; values are coerced
        as the reference's pydantic schema does (``"128"`` is 128).
        """
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise CheckpointError(f"{source}: audio_vae_config must be an object, got {type(data).__name__}")

        hints = typing.get_type_hints(cls)
        data = dict(data)
        if "latent_dim" in data and data["latent_dim"] is None:  # the reference's rule for a null latent_dim
            enc_dim = coerce(data.get("encoder_dim", cls.encoder_dim), int, f"{source}.encoder_dim")
            rates = coerce(data.get("encoder_rates", cls.encoder_rates), hints["encoder_rates"],
                            f"{source}.encoder_rates")
            data["latent_dim"] = enc_dim * 2 ** len(rates)
        kwargs = {f.name: coerce(data[f.name], hints[f.name], f"{source}.{f.name}")
                  for f in fields(cls) if f.name in data}  # unknown keys are ignored
        try:
            return cls(**kwargs)
        except CheckpointError as exc:
            raise CheckpointError(f"{source}: {exc}") from None

    @classmethod
    def from_model_config(cls, config: Mapping[str, Any], source: str = "config.json") -> AudioVAEConfig:
        """Read ``audio_vae_config`` from a parsed VoxCPM ``config.json`` (release defaults when absent)."""
        return cls.from_dict(config.get("audio_vae_config"), source=f"{source}: audio_vae_config")

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
