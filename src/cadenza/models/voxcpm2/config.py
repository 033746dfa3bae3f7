"""Typed configuration of a VoxCPM 2 model, read from the release's ``config.json``.

See docs/design.md, "VoxCPM 2 release files and configuration".

Every module size in ``models/voxcpm2`` comes from these dataclasses. Parsing follows the reference's pydantic
schema: unknown keys (``architecture``, ``dit_config.mean_mode``, ...) are ignored, missing optional keys take the
class defaults below, missing required keys are an error, and values are coerced as pydantic's lax mode does
(``"64"`` and ``64.0`` are the integer 64, ``"yes"`` is true). ``VoxCPM2Config.official()`` gives the released 2B
hyper-parameters (used for meta-device shape checks; a real checkpoint is always read from its own config.json).

The four transformer stacks (TSLM, RALM, LocEnc, LocDiT) are all MiniCPM-4 stacks derived from ``lm_config`` by a
copy with overrides, exactly as the reference does: LocEnc/LocDiT therefore inherit ``num_key_value_heads``, the
RoPE settings, ``rms_norm_eps``, ``no_rope`` and ``use_mup`` of the LM
(docs/design.md, "VoxCPM 2 release files and configuration").

Validation encodes only what the modules need: every check below names the reference behaviour it stands for
(a crash when the reference builds or first runs the model, or an output that is NaN for every input). Values the
reference builds and runs are accepted even when unusual (``decoder_dim`` not a multiple of ``2^n``, hidden sizes
not divisible by the head count, one RoPE factor for all frequencies, layer-free LocEnc/LocDiT, an unknown solver
name the reference ignores ...); ``tests/models/voxcpm2/test_vx2_configs.py`` runs each boundary.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadenza.errors import CheckpointError
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.config_values import from_mapping

ARCHITECTURE = "voxcpm2"
DTYPE_NAMES = ("bfloat16", "bf16", "float16", "fp16", "float32", "fp32")  # the reference's get_dtype accepts these
TRAINING_T_SCHEDULERS = ("log-norm", "uniform")  # the reference's sample_r_t raises for others

log = logging.getLogger(__name__)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckpointError(f"invalid VoxCPM 2 config: {msg}")


# Config keys of the fields of a derived stack (``MiniCPM4Config.stack``): the reference copies ``lm_config`` and
# overrides these; every other field is inherited from ``lm_config``.
_STACK_KEYS: dict[str, dict[str, str]] = {
    "lm_config": {},
    "residual_lm": {"num_hidden_layers": "residual_lm_num_layers", "no_rope": "residual_lm_no_rope"},
    "encoder_config": {"hidden_size": "encoder_config.hidden_dim", "intermediate_size": "encoder_config.ffn_dim",
                       "num_attention_heads": "encoder_config.num_heads",
                       "num_hidden_layers": "encoder_config.num_layers", "kv_channels": "encoder_config.kv_channels"},
    "dit_config": {"hidden_size": "dit_config.hidden_dim", "intermediate_size": "dit_config.ffn_dim",
                   "num_attention_heads": "dit_config.num_heads", "num_hidden_layers": "dit_config.num_layers",
                   "kv_channels": "dit_config.kv_channels"},
}
_STACK_NAMES = {"lm_config": "TSLM", "residual_lm": "RALM", "encoder_config": "LocEnc", "dit_config": "LocDiT"}


@dataclass(frozen=True)
class RopeScalingConfig:
    """MiniCPM LongRoPE factors. Only one list is used: ``long_factor`` when ``max_position_embeddings`` exceeds
    ``original_max_position_embeddings``, else ``short_factor``. The reference divides the ``head_dim / 2`` rotary
    frequencies by it elementwise (a one-value list broadcasts), and never interprets ``type`` (LongRoPE is always
    used). Checked per stack that uses RoPE (``MiniCPM4Config``), since each stack has its own head dim."""

    type: str
    long_factor: tuple[float, ...]
    short_factor: tuple[float, ...]
    original_max_position_embeddings: int


@dataclass(frozen=True)
class MiniCPM4Config:
    """One MiniCPM-4 transformer stack (``lm_config`` and the stacks derived from it).

    ``stack`` is ours (never read from JSON): which stack this is, so that errors name the config key to fix
    (``encoder_config.num_heads`` rather than the derived ``num_attention_heads``).
    """

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
    stack: str = field(default="lm_config", compare=False, repr=False, metadata={"internal": True})

    def key(self, name: str) -> str:
        """The config key a field of this stack comes from (``lm_config.<name>`` unless the stack overrides it)."""
        return _STACK_KEYS[self.stack].get(name, f"lm_config.{name}")

    def __post_init__(self) -> None:
        k, what = self.key, _STACK_NAMES[self.stack]

        def check(cond: bool, msg: str) -> None:
            _check(cond, f"{msg} ({what} stack)")

        # Zero widths/heads make layers without any channel: PyTorch (and so the reference) builds them, but nothing
        # flows through them. Refused on purpose, like negative counts (which the reference's range() reads as 0).
        check(self.hidden_size >= 1, f"{k('hidden_size')} must be >= 1, got {self.hidden_size}")
        # 0 is a valid (MLP-free) block: the reference builds and runs it.
        check(self.intermediate_size >= 0, f"{k('intermediate_size')} must be >= 0, got {self.intermediate_size}")
        check(self.num_hidden_layers >= 0, f"{k('num_hidden_layers')} must be >= 0, got {self.num_hidden_layers}")
        check(self.num_attention_heads >= 1, f"{k('num_attention_heads')} must be >= 1, got {self.num_attention_heads}")
        check(self.num_key_value_heads >= 1, f"{k('num_key_value_heads')} must be >= 1, got {self.num_key_value_heads}")
        # SDPA with enable_gqa (the reference) refuses query heads that do not split evenly over the kv heads.
        check(self.num_attention_heads % self.num_key_value_heads == 0,
              f"{k('num_attention_heads')} = {self.num_attention_heads} must be a multiple of "
              f"{k('num_key_value_heads')} = {self.num_key_value_heads} (grouped-query attention)")
        if self.kv_channels is not None:
            check(self.kv_channels >= 1, f"{k('kv_channels')} must be >= 1 when given, got {self.kv_channels}")
        else:  # head dim = hidden // heads (floor, as the reference): hidden need not divide by the head count
            check(self.head_dim >= 1, f"{k('hidden_size')} = {self.hidden_size} gives head dim 0 with "
                                      f"{self.num_attention_heads} heads: set {k('kv_channels')}")
        check(self.vocab_size >= 0, f"{k('vocab_size')} must be >= 0, got {self.vocab_size}")
        # Every stack shares it, LocDiT included, whose unconditional CFG condition tokens are all zero: RMSNorm
        # then computes 0 / sqrt(eps) (the reference's generations are NaN with eps 0).
        check(self.rms_norm_eps > 0, f"{k('rms_norm_eps')} must be > 0 (LocDiT normalises all-zero CFG condition "
                                     f"tokens), got {self.rms_norm_eps}")
        if not self.no_rope:
            self._check_rope(check)

    def _check_rope(self, check) -> None:
        """What LongRoPE needs (only stacks that use it; the reference builds the table at construction)."""
        k, rs = self.key, self.rope_scaling
        head_key = k("kv_channels") if self.kv_channels is not None else f"{k('hidden_size')} / {k('num_attention_heads')}"
        check(self.head_dim % 2 == 0, f"head dim {self.head_dim} ({head_key}) must be even: RoPE rotates pairs")
        check(self.rope_theta > 0, f"{k('rope_theta')} must be > 0 (the RoPE table is NaN otherwise)")
        # log(max_pos / orig) / log(orig) scales the table: both logs must exist and the divisor be non-zero.
        check(self.max_position_embeddings >= 1,
              f"{k('max_position_embeddings')} must be >= 1, got {self.max_position_embeddings}")
        check(rs.original_max_position_embeddings >= 2, f"{k('rope_scaling')}.original_max_position_embeddings "
                                                         f"must be >= 2, got {rs.original_max_position_embeddings}")
        name = "long_factor" if self.uses_long_rope_factors else "short_factor"
        factors = self.rope_factors
        check(len(factors) in (1, self.head_dim // 2),
              f"{k('rope_scaling')}.{name} (the list in use) needs head_dim / 2 = {self.head_dim // 2} values "
              f"(or 1, applied to every frequency), got {len(factors)}")
        check(all(f != 0 for f in factors), f"{k('rope_scaling')}.{name} must not contain 0 (the RoPE table "
                                            "divides by it)")

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    @property
    def uses_long_rope_factors(self) -> bool:
        return self.max_position_embeddings > self.rope_scaling.original_max_position_embeddings

    @property
    def rope_factors(self) -> tuple[float, ...]:
        """The LongRoPE list in use (see ``RopeScalingConfig``), one value per rotary frequency or a single value."""
        rs = self.rope_scaling
        return rs.long_factor if self.uses_long_rope_factors else rs.short_factor

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
    """LocEnc sizes (``encoder_config``); checked as the derived stack (``VoxCPM2Config.encoder_lm_config``)."""

    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 4
    kv_channels: int | None = None


@dataclass(frozen=True)
class CFMConfig:
    """Flow-matching settings (``dit_config.cfm_config``), all training-loss settings: at inference the reference
    always integrates with Euler whatever ``solver`` says, and takes the guidance weight from the call, not from
    ``inference_cfg_rate``. So no value here can break inference and none is checked at load (the two ranges are
    pairs by type, as in the reference's schema)."""

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
        if self.solver != "euler" or self.t_scheduler not in TRAINING_T_SCHEDULERS:
            # Fine for inference (the reference ignores both there); its training refuses an unknown t_scheduler.
            log.warning("cfm_config solver %r / t_scheduler %r: inference uses Euler; training supports only the "
                        "t_scheduler values %s", self.solver, self.t_scheduler, TRAINING_T_SCHEDULERS)


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
        # The time embedding is sinusoidal over hidden_dim: half sines, half cosines (the reference asserts an even
        # size) with frequencies exp(-ln(10^4)·j / (hidden_dim/2 - 1)), a division by zero for hidden_dim 2.
        _check(self.hidden_dim % 2 == 0 and self.hidden_dim >= 4,
               f"dit_config.hidden_dim must be even and >= 4 (sinusoidal time embedding), got {self.hidden_dim}")


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
    """The whole ``config.json``. ``audio_vae_config`` is kept as the raw (read-only) mapping for the AudioVAE code
    (validated here too, so a bad one fails when the config is read)."""

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

        _check(self.patch_size >= 1, f"patch_size must be >= 1, got {self.patch_size}")
        _check(self.feat_dim >= 1, f"feat_dim must be >= 1, got {self.feat_dim}")
        # The reference's prefill copies layer 0's keys into its KV cache: a stack without layers crashes there.
        _check(self.lm_config.num_hidden_layers >= 1,
               f"lm_config.num_hidden_layers must be >= 1 (the KV cache needs a layer), got "
               f"{self.lm_config.num_hidden_layers}")
        _check(self.residual_lm_num_layers >= 1,
               f"residual_lm_num_layers must be >= 1 (the KV cache needs a layer), got {self.residual_lm_num_layers}")
        _check(self.scalar_quantization_latent_dim >= 1,
               f"scalar_quantization_latent_dim must be >= 1, got {self.scalar_quantization_latent_dim}")
        # FSQ computes round(x·scale) / scale: 0 makes every audio-position state NaN (a negative scale is harmless).
        _check(self.scalar_quantization_scale != 0, "scalar_quantization_scale must not be 0")
        _check(self.max_length >= 1, f"max_length (KV-cache positions) must be >= 1, got {self.max_length}")
        _check(self.dtype in DTYPE_NAMES, f"dtype must be one of {DTYPE_NAMES}, got {self.dtype!r}")
        _check(self.lm_config.vocab_size >= 1, "lm_config.vocab_size must be >= 1 (the TSLM embeds text)")
        # Prompt patches (``feat_dim`` wide, read by LocEnc/LocDiT) are AudioVAE latents: the widths must agree.
        # The AudioVAE's own defaults apply when audio_vae_config (or its latent_dim) is absent: 64.
        vae = AudioVAEConfig.from_dict(self.audio_vae_config, source="audio_vae_config")
        _check(vae.latent_dim == self.feat_dim,
               f"audio_vae_config.latent_dim {vae.latent_dim}"
               f"{'' if 'latent_dim' in (self.audio_vae_config or {}) else ' (AudioVAE default)'} != "
               f"feat_dim {self.feat_dim}")
        _check(self.lm_config.stack == "lm_config", "lm_config must be the TSLM stack")
        # Derived stacks must be valid too (e.g. LocEnc heads must divide by the inherited kv heads).
        for name in ("residual_lm_config", "encoder_lm_config", "dit_lm_config"):
            getattr(self, name)()

    # --- the four stacks (copies of lm_config with overrides, docs/design.md) ---
    def base_lm_config(self) -> MiniCPM4Config:
        return self.lm_config

    def residual_lm_config(self) -> MiniCPM4Config:
        return self.lm_config.replace(
            num_hidden_layers=self.residual_lm_num_layers, vocab_size=0, no_rope=self.residual_lm_no_rope,
            stack="residual_lm",
        )

    def encoder_lm_config(self) -> MiniCPM4Config:
        e = self.encoder_config
        return self.lm_config.replace(
            hidden_size=e.hidden_dim, intermediate_size=e.ffn_dim, num_attention_heads=e.num_heads,
            num_hidden_layers=e.num_layers, kv_channels=e.kv_channels, vocab_size=0, stack="encoder_config",
        )

    def dit_lm_config(self) -> MiniCPM4Config:
        d = self.dit_config
        return self.lm_config.replace(
            hidden_size=d.hidden_dim, intermediate_size=d.ffn_dim, num_attention_heads=d.num_heads,
            num_hidden_layers=d.num_layers, kv_channels=d.kv_channels, vocab_size=0, stack="dit_config",
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
        return from_mapping(cls, data, source)

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
        """The released openbmb/VoxCPM2 hyper-parameters (docs/design.md; RoPE factors from a third-party port)."""
        from cadenza.models.voxcpm2.official_config import OFFICIAL_CONFIG

        return cls.from_dict(OFFICIAL_CONFIG, source="VoxCPM2Config.official()")


# --- generic JSON -> dataclass conversion (pydantic's lax coercions, as the reference's schema) ---
