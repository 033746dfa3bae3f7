"""Typed configuration of a VoxCPM 2 model, read from the release's ``config.json`` (spec §b.1).

Every module size in ``models/voxcpm2`` comes from these dataclasses. Parsing follows the reference's pydantic
schema: unknown keys (``architecture``, ``dit_config.mean_mode``, ...) are ignored, missing optional keys take the
class defaults below, missing required keys are an error. ``VoxCPM2Config.official()`` gives the released 2B
hyper-parameters (used for meta-device shape checks; a real checkpoint is always read from its own config.json).

The four transformer stacks (TSLM, RALM, LocEnc, LocDiT) are all MiniCPM-4 stacks derived from ``lm_config`` by a
copy with overrides, exactly as the reference does: LocEnc/LocDiT therefore inherit ``num_key_value_heads``, the
RoPE settings, ``rms_norm_eps`` and ``use_mup`` of the LM (spec §b.1 "Derived sub-configurations").
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadenza.errors import CheckpointError

ARCHITECTURE = "voxcpm2"
DTYPE_NAMES = ("bfloat16", "bf16", "float16", "fp16", "float32", "fp32")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckpointError(f"invalid VoxCPM 2 config: {msg}")


@dataclass(frozen=True)
class RopeScalingConfig:
    """MiniCPM LongRoPE factors: one per rotary frequency (``head_dim / 2`` each)."""

    type: str
    long_factor: tuple[float, ...]
    short_factor: tuple[float, ...]
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        # The reference never interprets ``type``: LongRoPE is always used. We accept the field as it does.
        _check(len(self.long_factor) == len(self.short_factor) > 0, "rope long/short factor lists differ in length")
        _check(all(f > 0 for f in self.long_factor + self.short_factor), "rope factors must be positive")
        _check(self.original_max_position_embeddings > 1, "original_max_position_embeddings must be > 1")


@dataclass(frozen=True)
class MiniCPM4Config:
    """One MiniCPM-4 transformer stack (``lm_config`` and the stacks derived from it)."""

    bos_token_id: int
    eos_token_id: int
    hidden_size: int
    intermediate_size: int
    max_position_embeddings: int
    num_attention_heads: int
    num_hidden_layers: int
    num_key_value_heads: int
    rms_norm_eps: float
    rope_scaling: RopeScalingConfig
    vocab_size: int  # 0: no embedding table (RALM, LocEnc, LocDiT)
    scale_emb: float
    dim_model_base: int
    scale_depth: float
    rope_theta: float
    use_mup: bool = True
    kv_channels: int | None = None
    no_rope: bool = False

    def __post_init__(self) -> None:
        _check(min(self.hidden_size, self.intermediate_size, self.num_hidden_layers) > 0, "stack sizes must be positive")
        _check(self.num_attention_heads > 0 and self.num_key_value_heads > 0, "head counts must be positive")
        _check(self.num_attention_heads % self.num_key_value_heads == 0,
               "num_attention_heads must be a multiple of num_key_value_heads")
        _check(self.kv_channels is not None or self.hidden_size % self.num_attention_heads == 0,
               "hidden_size must be divisible by num_attention_heads when kv_channels is absent")
        _check(self.head_dim > 0 and self.head_dim % 2 == 0, f"head dim must be even, got {self.head_dim}")
        _check(self.vocab_size >= 0 and self.rms_norm_eps > 0 and self.rope_theta > 0, "bad vocab/eps/theta")
        _check(self.max_position_embeddings > 0, "max_position_embeddings must be positive")
        _check(len(self.rope_scaling.short_factor) == self.head_dim // 2,
               f"rope factor lists need head_dim/2 = {self.head_dim // 2} values, got {len(self.rope_scaling.short_factor)}")

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    @property
    def residual_scale(self) -> float:
        """Multiplier of both residual branches: ``scale_depth / sqrt(layers)`` with muP, else 1."""
        return self.scale_depth / math.sqrt(self.num_hidden_layers) if self.use_mup else 1.0

    @property
    def embedding_scale(self) -> float:
        """Multiplier of text embeddings: ``scale_emb`` with muP, else 1."""
        return self.scale_emb if self.use_mup else 1.0

    def replace(self, **changes: Any) -> MiniCPM4Config:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class EncoderConfig:
    """LocEnc sizes (``encoder_config``)."""

    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 4
    kv_channels: int | None = None

    def __post_init__(self) -> None:
        _check(min(self.hidden_dim, self.ffn_dim, self.num_heads, self.num_layers) > 0, "encoder sizes must be positive")


@dataclass(frozen=True)
class CFMConfig:
    """Flow-matching settings (``dit_config.cfm_config``). Only ``solver`` matters at inference; the rest drive the
    training loss. ``inference_cfg_rate`` is read but, as in the reference, the guidance weight comes from the call."""

    sigma_min: float = 1e-6
    solver: str = "euler"
    t_scheduler: str = "log-norm"
    training_cfg_rate: float = 0.1
    inference_cfg_rate: float = 1.0
    reg_loss_type: str = "l1"
    ratio_r_neq_t_range: tuple[float, float] = (0.25, 0.75)
    noise_cond_prob_range: tuple[float, float] = (0.0, 0.0)
    noise_cond_scale: float = 0.0

    def __post_init__(self) -> None:
        _check(self.solver == "euler", f"only the euler solver exists, got {self.solver!r}")
        _check(self.t_scheduler in ("log-norm", "uniform"), f"unknown t_scheduler {self.t_scheduler!r}")
        _check(len(self.ratio_r_neq_t_range) == 2 and len(self.noise_cond_prob_range) == 2, "ranges need 2 values")


@dataclass(frozen=True)
class DiTConfig:
    """LocDiT sizes (``dit_config``). The reference reads ``dit_mean_mode``; a ``mean_mode`` key is ignored."""

    cfm_config: CFMConfig
    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 4
    kv_channels: int | None = None
    dit_mean_mode: bool = False

    def __post_init__(self) -> None:
        _check(min(self.hidden_dim, self.ffn_dim, self.num_heads, self.num_layers) > 0, "DiT sizes must be positive")
        _check(self.hidden_dim % 2 == 0, "DiT hidden_dim must be even (sinusoidal time embedding)")


@dataclass(frozen=True)
class SpecialTokens:
    """Ids the model uses around audio segments (hard-coded in the reference, not read from the tokenizer)."""

    audio_start: int = 101
    audio_end: int = 102
    ref_audio_start: int = 103
    ref_audio_end: int = 104
    audio_pad: int = 0  # text id carried by audio positions (masked out)


@dataclass(frozen=True)
class VoxCPM2Config:
    """The whole ``config.json``. ``audio_vae_config`` is kept as the raw (read-only) mapping for the AudioVAE code."""

    lm_config: MiniCPM4Config
    encoder_config: EncoderConfig
    dit_config: DiTConfig
    patch_size: int = 4
    feat_dim: int = 64
    residual_lm_num_layers: int = 8
    residual_lm_no_rope: bool = False
    scalar_quantization_latent_dim: int = 512
    scalar_quantization_scale: int = 9
    audio_vae_config: Mapping[str, Any] | None = field(default=None, hash=False)
    max_length: int = 8192
    device: str = "cuda"
    dtype: str = "bfloat16"
    special_tokens: SpecialTokens = field(default_factory=SpecialTokens)

    def __post_init__(self) -> None:
        _check(self.patch_size > 0 and self.feat_dim > 0, "patch_size and feat_dim must be positive")
        _check(self.residual_lm_num_layers > 0, "residual_lm_num_layers must be positive")
        _check(self.scalar_quantization_latent_dim > 0 and self.scalar_quantization_scale > 0, "bad FSQ sizes")
        _check(self.max_length > 0, "max_length must be positive")
        _check(self.dtype in DTYPE_NAMES, f"dtype must be one of {DTYPE_NAMES}, got {self.dtype!r}")
        _check(self.lm_config.vocab_size > 0, "lm_config.vocab_size must be positive (the TSLM embeds text)")
        vae_latent = (self.audio_vae_config or {}).get("latent_dim", self.feat_dim)
        _check(vae_latent == self.feat_dim, f"audio_vae_config.latent_dim {vae_latent} != feat_dim {self.feat_dim}")
        # Derived stacks must be valid too (e.g. LocEnc heads must divide by the inherited kv heads).
        for name in ("residual_lm_config", "encoder_lm_config", "dit_lm_config"):
            getattr(self, name)()

    # --- the four stacks (copies of lm_config with overrides, spec §b.1) ---
    def base_lm_config(self) -> MiniCPM4Config:
        return self.lm_config

    def residual_lm_config(self) -> MiniCPM4Config:
        return self.lm_config.replace(
            num_hidden_layers=self.residual_lm_num_layers, vocab_size=0, no_rope=self.residual_lm_no_rope
        )

    def encoder_lm_config(self) -> MiniCPM4Config:
        e = self.encoder_config
        return self.lm_config.replace(
            hidden_size=e.hidden_dim, intermediate_size=e.ffn_dim, num_attention_heads=e.num_heads,
            num_hidden_layers=e.num_layers, kv_channels=e.kv_channels, vocab_size=0,
        )

    def dit_lm_config(self) -> MiniCPM4Config:
        d = self.dit_config
        return self.lm_config.replace(
            hidden_size=d.hidden_dim, intermediate_size=d.ffn_dim, num_attention_heads=d.num_heads,
            num_hidden_layers=d.num_layers, kv_channels=d.kv_channels, vocab_size=0,
        )

    # --- reading ---
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "config.json") -> VoxCPM2Config:
        if not isinstance(data, Mapping):
            raise CheckpointError(f"{source}: expected a JSON object, found {type(data).__name__}")
        arch = str(data.get("architecture", "")).lower()
        if arch != ARCHITECTURE:
            raise CheckpointError(
                f"{source}: architecture is {data.get('architecture')!r}, expected {ARCHITECTURE!r} "
                "(VoxCPM 1 / 1.5 checkpoints are not supported)"
            )
        return _from_mapping(cls, data, source)

    @classmethod
    def from_json(cls, path: str | Path) -> VoxCPM2Config:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read VoxCPM 2 config {path}: {exc}") from exc
        return cls.from_dict(data, source=str(path))

    @classmethod
    def official(cls) -> VoxCPM2Config:
        """The released openbmb/VoxCPM2 hyper-parameters (spec §b.1; RoPE factors [EXTERNAL])."""
        from cadenza.models.voxcpm2.official_config import OFFICIAL_CONFIG

        return cls.from_dict(OFFICIAL_CONFIG, source="VoxCPM2Config.official()")


# --- generic, strict JSON -> dataclass conversion ---

def _from_mapping(cls: type, data: Mapping[str, Any], where: str) -> Any:
    if not isinstance(data, Mapping):
        raise CheckpointError(f"{where}: expected an object, found {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise CheckpointError(f"{where}: required key {f.name!r} is missing")
    try:
        return cls(**kwargs)
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {exc}") from exc


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner, where)
    if dataclasses.is_dataclass(hint):
        return _from_mapping(hint, value, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise CheckpointError(f"{where}: expected true/false, found {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise CheckpointError(f"{where}: expected an integer, found {value!r}")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CheckpointError(f"{where}: expected a number, found {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise CheckpointError(f"{where}: expected a string, found {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise CheckpointError(f"{where}: expected a list, found {value!r}")
        item = args[0]
        if len(args) != 2 or args[1] is not Ellipsis:  # fixed-length tuple
            if len(value) != len(args):
                raise CheckpointError(f"{where}: expected {len(args)} values, found {len(value)}")
        return tuple(_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict) or hint is dict:
        if not isinstance(value, Mapping):
            raise CheckpointError(f"{where}: expected an object, found {value!r}")
        return types.MappingProxyType(dict(value))
    raise TypeError(f"unsupported config field type {hint!r} at {where}")
