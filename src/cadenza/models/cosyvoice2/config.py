"""Typed configuration of a CosyVoice 2 model, read from the released ``cosyvoice2.yaml`` as data.

Every module size in ``models/cosyvoice2`` comes from these dataclasses; nothing is hard-coded in the
modules. ``CosyVoice2Config.official()`` gives the released CosyVoice2-0.5B hyper-parameters.

Reading is strict: a wrong type, a wrong sign, a missing required key or an unknown class / scheduler name is a
``CheckpointError`` that names the file and the dotted key, e.g.
``cosyvoice2.yaml: flow.output_size must be a positive integer, got -80``. The dataclasses check themselves too
(types, signs, and the sizes that must agree), so a config built in code is held to the same rules.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadenza.errors import CheckpointError
from cadenza.loading.files import read_json_object
from cadenza.models.cosyvoice2.yaml_reader import Unresolved, read_hyperpyyaml

# Estimator class names seen in releases (old ModelScope revisions used the non-causal name with causal: True).
KNOWN_ESTIMATOR_TAGS = ("CausalConditionalDecoder", "ConditionalDecoder")
T_SCHEDULERS = ("cosine", "linear")
# Sizes that allocate real memory while the model is built, before the weights are compared with it (the CFM's
# fixed noise is 15000 x mel bins, the vocoder's STFT window n_fft): bounded so a wrong config cannot exhaust RAM.
MAX_MEL_BINS = 1024
MAX_FFT = 1 << 16


class _InvalidConfig(CheckpointError):
    """A dataclass check failed; ``CosyVoice2Config.from_dict`` adds the file name."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise _InvalidConfig(f"invalid CosyVoice 2 config: {msg}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int_what(minimum: int | None) -> str:
    return {1: "a positive integer", 0: "a non-negative integer", None: "an integer"}.get(
        minimum, f"an integer >= {minimum}")


def _real_what(minimum: float | None, positive: bool, maximum: float | None) -> str:
    if positive:
        what = "a positive number"
    elif minimum == 0:
        what = "a non-negative number"
    elif minimum is None:
        what = "a finite number"
    else:
        what = f"a number >= {minimum:g}"
    return what + (f" <= {maximum:g}" if maximum is not None else "")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _ints(obj: object, names: tuple[str, ...], minimum: int | None = 1) -> None:
    for name in names:
        v = getattr(obj, name)
        _check(_is_int(v) and (minimum is None or v >= minimum),
               f"{type(obj).__name__}.{name} must be {_int_what(minimum)}, got {_show(v)}")


def _reals(obj: object, names: tuple[str, ...], minimum: float | None = 0.0, positive: bool = False,
           maximum: float | None = None) -> None:
    for name in names:
        v = getattr(obj, name)
        ok = _is_real(v) and (minimum is None or v >= minimum) and (not positive or v > 0)
        _check(ok and (maximum is None or v <= maximum),
               f"{type(obj).__name__}.{name} must be {_real_what(minimum, positive, maximum)}, got {_show(v)}")


def _int_tuple(obj: object, name: str, length: int | None = None, nested: bool = False) -> None:
    v = getattr(obj, name)
    items = v if isinstance(v, tuple) else None
    if nested and items is not None:
        ok = len(items) > 0 and all(isinstance(t, tuple) and t and all(_is_int(i) and i > 0 for i in t) for t in items)
    else:
        ok = items is not None and len(items) > 0 and all(_is_int(i) and i > 0 for i in items)
    what = "a non-empty tuple of non-empty tuples of positive integers" if nested else "a non-empty tuple of positive integers"
    _check(ok and (length is None or len(items) == length),
           f"{type(obj).__name__}.{name} must be {what}{f' of length {length}' if length else ''}, got {_show(v)}")


def _is(obj: object, name: str, cls: type) -> None:
    _check(isinstance(getattr(obj, name), cls), f"{type(obj).__name__}.{name} must be a {cls.__name__}")


@dataclass(frozen=True)
class Qwen2Config:
    """The Qwen2 body of the text-speech LM (``CosyVoice-BlankEN/config.json``)."""

    hidden_size: int = 896
    num_hidden_layers: int = 24
    num_attention_heads: int = 14
    num_key_value_heads: int = 2
    intermediate_size: int = 4864
    vocab_size: int = 151936
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True

    # Keys config.json must state: defaulting them would silently build another model.
    REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")

    def __post_init__(self) -> None:
        _ints(self, ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "intermediate_size", "vocab_size", "max_position_embeddings"))
        _reals(self, ("rope_theta", "rms_norm_eps"), positive=True)
        _check(isinstance(self.tie_word_embeddings, bool), "Qwen2Config.tie_word_embeddings must be true or false")
        _check(self.hidden_size % self.num_attention_heads == 0, "hidden_size must be divisible by num_attention_heads")
        _check(self.num_attention_heads % self.num_key_value_heads == 0,
               "num_attention_heads must be a multiple of num_key_value_heads")
        _check(self.head_dim % 2 == 0, "head_dim (hidden_size / num_attention_heads) must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_json(cls, path: str | Path) -> Qwen2Config:
        """Read ``config.json``; every error names the file and the key."""
        path = Path(path)
        data = read_json_object(path)
        fields_ = cls.__dataclass_fields__
        for key in cls.REQUIRED:
            if key not in data:
                raise CheckpointError(f"{path}: {key} is required")
        values: dict[str, Any] = {}
        for key in fields_:
            if key not in data:
                continue
            v = data[key]
            if fields_[key].type == "bool":
                if not isinstance(v, bool):
                    raise CheckpointError(f"{path}: {key} must be true or false, got {_show(v)}")
            elif fields_[key].type == "float":
                if not (_is_real(v) and v > 0):
                    raise CheckpointError(f"{path}: {key} must be a positive number, got {_show(v)}")
            elif not (_is_int(v) and v > 0):
                raise CheckpointError(f"{path}: {key} must be a positive integer, got {_show(v)}")
            values[key] = v
        head_dim = data.get("head_dim")
        if head_dim is not None and head_dim != values["hidden_size"] // values["num_attention_heads"]:
            raise CheckpointError(f"{path}: head_dim {_show(head_dim)} != hidden_size / num_attention_heads is not "
                                  "supported")
        try:
            return cls(**values)
        except _InvalidConfig as exc:
            raise CheckpointError(f"{path}: {exc}") from exc


@dataclass(frozen=True)
class SamplingConfig:
    """Repetition-aware sampling (RAS) parameters."""

    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1

    def __post_init__(self) -> None:
        _ints(self, ("top_k", "win_size"))
        _reals(self, ("top_p",), positive=True, maximum=1.0)
        _reals(self, ("tau_r",))


@dataclass(frozen=True)
class LMConfig:
    """Text-speech LM: Qwen2 body + speech embedding / decoder over ``speech_token_size + 3`` ids."""

    qwen: Qwen2Config = field(default_factory=Qwen2Config)
    llm_input_size: int = 896
    llm_output_size: int = 896
    speech_token_size: int = 6561
    mix_ratio: tuple[int, int] = (5, 15)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0

    def __post_init__(self) -> None:
        _is(self, "qwen", Qwen2Config)
        _is(self, "sampling", SamplingConfig)
        _ints(self, ("llm_input_size", "llm_output_size", "speech_token_size"))
        _int_tuple(self, "mix_ratio", length=2)
        _reals(self, ("min_token_text_ratio", "max_token_text_ratio"))
        _check(self.llm_input_size == self.qwen.hidden_size == self.llm_output_size,
               "llm_input_size and llm_output_size must equal the Qwen2 hidden_size")
        _check(self.min_token_text_ratio < self.max_token_text_ratio,
               "need 0 <= llm.min_token_text_ratio < llm.max_token_text_ratio")

    @property
    def eos_id(self) -> int:
        return self.speech_token_size

    @property
    def fill_id(self) -> int:
        return self.speech_token_size + 2

    @property
    def num_speech_ids(self) -> int:
        """Rows of ``speech_embedding`` / outputs of ``llm_decoder`` (tokens + eos + unused + fill)."""
        return self.speech_token_size + 3


@dataclass(frozen=True)
class FlowEncoderConfig:
    """``UpsampleConformerEncoder``: conformer blocks, x2 upsampling, more conformer blocks."""

    input_size: int = 512
    output_size: int = 512
    attention_heads: int = 8
    linear_units: int = 2048
    num_blocks: int = 6
    num_up_blocks: int = 4
    upsample_stride: int = 2
    pre_lookahead_len: int = 3
    static_chunk_size: int = 25  # tokens per attention chunk when streaming

    def __post_init__(self) -> None:
        _ints(self, ("input_size", "output_size", "attention_heads", "linear_units", "num_blocks", "num_up_blocks",
                     "upsample_stride", "static_chunk_size"))
        _ints(self, ("pre_lookahead_len",), minimum=0)
        _check(self.input_size == self.output_size, "flow encoder input_size must equal output_size")
        _check(self.output_size % self.attention_heads == 0, "encoder output_size must be divisible by attention_heads")


@dataclass(frozen=True)
class EstimatorConfig:
    """``CausalConditionalDecoder``: the causal 1-level U-Net velocity estimator."""

    in_channels: int = 320
    out_channels: int = 80
    channels: tuple[int, ...] = (256,)
    attention_head_dim: int = 64
    n_blocks: int = 4
    num_mid_blocks: int = 12
    num_heads: int = 8
    static_chunk_size: int = 50  # mel frames per attention chunk when streaming
    num_decoding_left_chunks: int = -1  # <0: all left chunks

    def __post_init__(self) -> None:
        _ints(self, ("in_channels", "out_channels", "attention_head_dim", "n_blocks", "num_mid_blocks", "num_heads",
                     "static_chunk_size"))
        _ints(self, ("num_decoding_left_chunks",), minimum=None)
        _int_tuple(self, "channels")


@dataclass(frozen=True)
class CFMConfig:
    """Conditional flow matching sampler (Euler, cosine schedule, CFG, fixed noise)."""

    sigma_min: float = 1e-6
    t_scheduler: str = "cosine"
    training_cfg_rate: float = 0.2
    inference_cfg_rate: float = 0.7
    n_timesteps: int = 10
    noise_frames: int = 15000  # the fixed noise buffer: 300 s of mel frames
    noise_seed: int = 0

    def __post_init__(self) -> None:
        _check(self.t_scheduler in T_SCHEDULERS, f"unknown t_scheduler {self.t_scheduler!r} (one of {T_SCHEDULERS})")
        _reals(self, ("sigma_min", "inference_cfg_rate"))
        _reals(self, ("training_cfg_rate",), maximum=1.0)
        _ints(self, ("n_timesteps", "noise_frames"))
        _ints(self, ("noise_seed",), minimum=0)


@dataclass(frozen=True)
class FlowConfig:
    """``CausalMaskedDiffWithXvec``: speech tokens + prompt mel + x-vector -> mel."""

    vocab_size: int = 6561
    input_size: int = 512
    output_size: int = 80
    spk_embed_dim: int = 192
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    encoder: FlowEncoderConfig = field(default_factory=FlowEncoderConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    cfm: CFMConfig = field(default_factory=CFMConfig)

    def __post_init__(self) -> None:
        for name, cls in (("encoder", FlowEncoderConfig), ("estimator", EstimatorConfig), ("cfm", CFMConfig)):
            _is(self, name, cls)
        _ints(self, ("vocab_size", "input_size", "output_size", "spk_embed_dim", "token_mel_ratio"))
        _ints(self, ("pre_lookahead_len",), minimum=0)
        _check(self.output_size <= MAX_MEL_BINS, f"flow output_size (mel bins) {self.output_size} > {MAX_MEL_BINS}")
        _check(self.encoder.input_size == self.input_size, "flow input_size must equal the encoder input_size")
        _check(self.estimator.in_channels == 4 * self.output_size, "estimator in_channels must be 4 x mel bins (x, mu, spk, cond)")
        _check(self.estimator.out_channels == self.output_size, "estimator out_channels must equal the mel bins")
        _check(self.encoder.upsample_stride == self.token_mel_ratio, "encoder upsampling must equal token_mel_ratio")


@dataclass(frozen=True)
class HiFTConfig:
    """HiFT vocoder: NSF source + iSTFT HiFi-GAN generator, mel -> waveform."""

    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    istft_n_fft: int = 16
    istft_hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_cond_channels: int = 512
    f0_num_class: int = 1

    def __post_init__(self) -> None:
        _ints(self, ("in_channels", "base_channels", "sampling_rate", "istft_n_fft", "istft_hop_len",
                     "f0_cond_channels", "f0_num_class"))
        _ints(self, ("nb_harmonics",), minimum=0)
        _reals(self, ("nsf_alpha", "nsf_sigma", "nsf_voiced_threshold", "lrelu_slope"))
        _reals(self, ("audio_limit",), positive=True)
        for name in ("upsample_rates", "upsample_kernel_sizes", "resblock_kernel_sizes", "source_resblock_kernel_sizes"):
            _int_tuple(self, name)
        for name in ("resblock_dilation_sizes", "source_resblock_dilation_sizes"):
            _int_tuple(self, name, nested=True)
        _check(self.istft_n_fft <= MAX_FFT, f"hift istft n_fft {self.istft_n_fft} > {MAX_FFT}")
        _check(self.istft_hop_len <= self.istft_n_fft, "hift istft hop_len must not exceed n_fft")
        _check(len(self.upsample_rates) == len(self.upsample_kernel_sizes), "upsample rates/kernels differ in length")
        _check(len(self.resblock_kernel_sizes) == len(self.resblock_dilation_sizes), "resblock kernels/dilations differ")
        _check(len(self.source_resblock_kernel_sizes) == len(self.upsample_rates), "one source resblock per upsample stage")
        _check(len(self.source_resblock_dilation_sizes) == len(self.source_resblock_kernel_sizes),
               "source resblock kernels/dilations differ in length")

    @property
    def hop_length(self) -> int:
        """Waveform samples per mel frame (480 for the release)."""
        n = self.istft_hop_len
        for r in self.upsample_rates:
            n *= r
        return n


@dataclass(frozen=True)
class MelConfig:
    """The 24 kHz 80-bin log-mel used for the flow prompt (matcha ``mel_spectrogram``)."""

    n_fft: int = 1920
    num_mels: int = 80
    sampling_rate: int = 24000
    hop_size: int = 480
    win_size: int = 1920
    fmin: float = 0.0
    fmax: float | None = 8000.0
    center: bool = False

    def __post_init__(self) -> None:
        _ints(self, ("n_fft", "num_mels", "sampling_rate", "hop_size", "win_size"))
        _reals(self, ("fmin",))
        if self.fmax is not None:
            _reals(self, ("fmax",), positive=True)
            _check(self.fmin < self.fmax, "mel fmin must be below fmax")
        _check(isinstance(self.center, bool), "MelConfig.center must be true or false")
        _check(self.n_fft <= MAX_FFT and self.num_mels <= MAX_MEL_BINS,
               f"mel n_fft must be <= {MAX_FFT} and num_mels <= {MAX_MEL_BINS}")
        _check(self.win_size <= self.n_fft, "mel win_size must not exceed n_fft")


@dataclass(frozen=True)
class CosyVoice2Config:
    sample_rate: int = 24000
    token_frame_rate: int = 25
    token_mel_ratio: int = 2
    chunk_size: int = 25
    lm: LMConfig = field(default_factory=LMConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    hift: HiFTConfig = field(default_factory=HiFTConfig)
    mel: MelConfig = field(default_factory=MelConfig)

    def __post_init__(self) -> None:
        for name, cls in (("lm", LMConfig), ("flow", FlowConfig), ("hift", HiFTConfig), ("mel", MelConfig)):
            _is(self, name, cls)
        _ints(self, ("sample_rate", "token_frame_rate", "token_mel_ratio", "chunk_size"))
        _check(self.hift.sampling_rate == self.sample_rate == self.mel.sampling_rate, "sample rates disagree")
        _check(self.mel.hop_size == self.hift.hop_length, "mel hop must equal the vocoder's samples per frame")
        _check(self.mel.num_mels == self.flow.output_size == self.hift.in_channels, "mel bins disagree")
        _check(self.flow.vocab_size == self.lm.speech_token_size, "flow vocab_size must equal LM speech_token_size")
        _check(self.flow.token_mel_ratio == self.token_mel_ratio, "flow token_mel_ratio must equal token_mel_ratio")

    @classmethod
    def official(cls) -> CosyVoice2Config:
        """The released CosyVoice2-0.5B hyper-parameters."""
        return cls()

    @classmethod
    def from_files(cls, yaml_path: str | Path, qwen_config_path: str | Path) -> CosyVoice2Config:
        return cls.from_dict(read_hyperpyyaml(yaml_path), Qwen2Config.from_json(qwen_config_path), source=str(yaml_path))

    @classmethod
    def from_dict(cls, y: dict[str, Any], qwen: Qwen2Config, source: str = "config") -> CosyVoice2Config:
        """Build from the yaml's structure (``read_hyperpyyaml`` output or plain data); ``source`` names the file
        in error messages."""
        if not isinstance(y, dict):
            raise CheckpointError(f"{source}: the config must be a mapping, got {type(y).__name__}")
        try:
            return cls._from_dict(_Yaml(y, source), qwen)
        except _InvalidConfig as exc:  # a check across values: the file is named here, keys in the message
            raise CheckpointError(f"{source}: {exc}") from exc

    @classmethod
    def _from_dict(cls, r: _Yaml, qwen: Qwen2Config) -> CosyVoice2Config:
        llm, flow, hift = r.section("llm"), r.section("flow"), r.section("hift")
        enc, dec = flow.section("encoder"), flow.section("decoder")
        est, cfm = dec.section("estimator"), dec.section("cfm_params", required=False)
        est.check_tag(KNOWN_ESTIMATOR_TAGS)
        token_rate = r.integer("token_frame_rate", 25)
        top_ratio, flow_ratio = r.integer("token_mel_ratio", None), flow.integer("token_mel_ratio", None)
        if top_ratio is not None and flow_ratio is not None and top_ratio != flow_ratio:
            r.fail("token_mel_ratio", f"({top_ratio}) disagrees with flow.token_mel_ratio ({flow_ratio})")
        ratio = top_ratio or flow_ratio or 2
        chunk = r.integer("chunk_size", token_rate)
        samp = llm.section("sampling", required=False)
        samp.check_tag(("ras_sampling",))  # another sampler would silently be replaced by RAS
        lm = LMConfig(
            qwen=qwen,
            llm_input_size=llm.integer("llm_input_size", r.integer("llm_input_size", qwen.hidden_size)),
            llm_output_size=llm.integer("llm_output_size", r.integer("llm_output_size", qwen.hidden_size)),
            speech_token_size=llm.integer("speech_token_size"),
            mix_ratio=llm.integers("mix_ratio", (5, 15), length=2),
            sampling=SamplingConfig(top_p=samp.real("top_p", 0.8, positive=True, maximum=1.0),
                                    top_k=samp.integer("top_k", 25), win_size=samp.integer("win_size", 10),
                                    tau_r=samp.real("tau_r", 0.1)),
            # Not in the release's yaml (its code fixes 2 and 20); a model trained with another text tokenizer
            # states its own speech/text length range here.
            min_token_text_ratio=llm.real("min_token_text_ratio", 2.0),
            max_token_text_ratio=llm.real("max_token_text_ratio", 20.0),
        )
        lookahead = flow.integer("pre_lookahead_len", 3, minimum=0)
        flow_input = flow.integer("input_size")
        encoder = FlowEncoderConfig(
            input_size=enc.integer("input_size", flow_input),
            output_size=enc.integer("output_size"),
            attention_heads=enc.integer("attention_heads"),
            linear_units=enc.integer("linear_units"),
            num_blocks=enc.integer("num_blocks"),
            upsample_stride=ratio,
            pre_lookahead_len=lookahead,
            # 0 / absent: the streaming chunk of the whole model (the reference refs <chunk_size> here)
            static_chunk_size=enc.integer("static_chunk_size", 0, minimum=0) or chunk,
        )
        estimator = EstimatorConfig(
            in_channels=est.integer("in_channels"),
            out_channels=est.integer("out_channels"),
            channels=est.integers("channels"),
            attention_head_dim=est.integer("attention_head_dim"),
            n_blocks=est.integer("n_blocks"),
            num_mid_blocks=est.integer("num_mid_blocks"),
            num_heads=est.integer("num_heads"),
            static_chunk_size=est.integer("static_chunk_size", 0, minimum=0) or chunk * ratio,
            num_decoding_left_chunks=est.integer("num_decoding_left_chunks", -1, minimum=None),
        )
        cfm.choice("solver", "euler", ("euler",))  # the only ODE solver implemented
        cfm_cfg = CFMConfig(
            sigma_min=cfm.real("sigma_min", 1e-6),
            t_scheduler=cfm.choice("t_scheduler", "cosine", T_SCHEDULERS),
            training_cfg_rate=cfm.real("training_cfg_rate", 0.2, maximum=1.0),
            inference_cfg_rate=cfm.real("inference_cfg_rate", 0.7),
        )
        flow_cfg = FlowConfig(
            vocab_size=flow.integer("vocab_size"),
            input_size=flow_input,
            output_size=flow.integer("output_size"),
            spk_embed_dim=flow.integer("spk_embed_dim", r.integer("spk_embed_dim", 192)),
            token_mel_ratio=ratio,
            pre_lookahead_len=lookahead,
            encoder=encoder,
            estimator=estimator,
            cfm=cfm_cfg,
        )
        istft = hift.section("istft_params", required=False)
        f0 = hift.section("f0_predictor", required=False)
        base_channels = hift.integer("base_channels")
        hift_cfg = HiFTConfig(
            in_channels=hift.integer("in_channels"),
            base_channels=base_channels,
            nb_harmonics=hift.integer("nb_harmonics", minimum=0),
            sampling_rate=hift.integer("sampling_rate"),
            nsf_alpha=hift.real("nsf_alpha"),
            nsf_sigma=hift.real("nsf_sigma"),
            nsf_voiced_threshold=hift.real("nsf_voiced_threshold"),
            upsample_rates=hift.integers("upsample_rates"),
            upsample_kernel_sizes=hift.integers("upsample_kernel_sizes"),
            istft_n_fft=istft.integer("n_fft", 16),
            istft_hop_len=istft.integer("hop_len", 4),
            resblock_kernel_sizes=hift.integers("resblock_kernel_sizes"),
            resblock_dilation_sizes=hift.nested_integers("resblock_dilation_sizes"),
            source_resblock_kernel_sizes=hift.integers("source_resblock_kernel_sizes"),
            source_resblock_dilation_sizes=hift.nested_integers("source_resblock_dilation_sizes"),
            lrelu_slope=hift.real("lrelu_slope", 0.1),
            audio_limit=hift.real("audio_limit", 0.99, positive=True),
            f0_cond_channels=f0.integer("cond_channels", base_channels),
            f0_num_class=f0.integer("num_class", 1),
        )
        sample_rate = r.integer("sample_rate", 24000)
        fe = r.section("feat_extractor", required=False)
        mel = MelConfig(
            n_fft=fe.integer("n_fft", 1920),
            num_mels=fe.integer("num_mels", 80),
            sampling_rate=fe.integer("sampling_rate", sample_rate),
            hop_size=fe.integer("hop_size", 480),
            win_size=fe.integer("win_size", 1920),
            fmin=fe.real("fmin", 0.0),
            fmax=fe.real("fmax", 8000.0, positive=True, allow_none=True),
            center=fe.flag("center", False),
        )
        return cls(
            sample_rate=sample_rate,
            token_frame_rate=token_rate,
            token_mel_ratio=ratio,
            chunk_size=chunk,
            lm=lm,
            flow=flow_cfg,
            hift=hift_cfg,
            mel=mel,
        )


_REQUIRED: Any = object()
# YAML 1.2 floats such as ``1e-06`` (the release's sigma_min): HyperPyYAML (ruamel) reads them as numbers, PyYAML's
# YAML 1.1 resolver as strings.
_YAML12_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")


class _Yaml:
    """Typed access to one mapping of the yaml; every message names the file and the dotted key."""

    def __init__(self, data: dict[str, Any], source: str, path: str = "") -> None:
        self.data, self.source, self.path = data, source, path

    def key(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, msg: str) -> None:
        raise CheckpointError(f"{self.source}: {self.key(key)} {msg}")

    def _get(self, key: str, default: Any) -> tuple[bool, Any]:
        """(present, value); a missing required key and an unresolvable ``!ref`` fail here."""
        if key not in self.data:
            if default is _REQUIRED:
                self.fail(key, "is required")
            return False, default
        value = self.data[key]
        if isinstance(value, Unresolved):
            self.fail(key, f"cannot be resolved: {value.reason}")
        return True, value

    def section(self, key: str, required: bool = True) -> _Yaml:
        present, value = self._get(key, _REQUIRED if required else {})
        if not isinstance(value, dict):
            self.fail(key, f"must be a mapping, got {_show(value)}")
        return _Yaml(value, self.source, self.key(key))

    def check_tag(self, known: tuple[str, ...]) -> None:
        """The class a ``!new:``/``!name:`` tag names must be one of ``known`` (by its last dotted part)."""
        tag = self.data.get("__tag__")
        if tag is None:
            return
        if not isinstance(tag, str) or tag.rsplit(".", 1)[-1] not in known:
            raise CheckpointError(f"{self.source}: {self.path}: unknown class {_show(tag)}; expected one of {known}")

    def _int_value(self, key: str, value: Any, minimum: int | None) -> int:
        if isinstance(value, float) and value.is_integer():  # !ref arithmetic with "/" gives floats
            value = int(value)
        if not _is_int(value) or (minimum is not None and value < minimum):
            self.fail(key, f"must be {_int_what(minimum)}, got {_show(value)}")
        return value

    def integer(self, key: str, default: Any = _REQUIRED, minimum: int | None = 1) -> Any:
        present, value = self._get(key, default)
        return self._int_value(key, value, minimum) if present else value

    def integers(self, key: str, default: Any = _REQUIRED, length: int | None = None) -> tuple[int, ...]:
        present, value = self._get(key, default)
        if not present:
            return tuple(value)
        if not isinstance(value, (list, tuple)) or not value or (length is not None and len(value) != length):
            size = f"{length} positive integers" if length else "a non-empty list of positive integers"
            self.fail(key, f"must be {size}, got {_show(value)}")
        return tuple(self._int_value(f"{key}[{i}]", v, 1) for i, v in enumerate(value))

    def nested_integers(self, key: str) -> tuple[tuple[int, ...], ...]:
        _, value = self._get(key, _REQUIRED)
        if not isinstance(value, (list, tuple)) or not value:
            self.fail(key, f"must be a non-empty list of lists of positive integers, got {_show(value)}")
        inner = _Yaml({f"{key}[{i}]": v for i, v in enumerate(value)}, self.source, self.path)
        return tuple(inner.integers(f"{key}[{i}]") for i in range(len(value)))

    def real(self, key: str, default: Any = _REQUIRED, minimum: float | None = 0.0, positive: bool = False,
             maximum: float | None = None, allow_none: bool = False) -> Any:
        present, value = self._get(key, default)
        if not present or (allow_none and value is None):
            return value
        if isinstance(value, str) and _YAML12_FLOAT.fullmatch(value.strip()):
            value = float(value)
        ok = _is_real(value) and (minimum is None or value >= minimum) and (not positive or value > 0)
        if not ok or (maximum is not None and value > maximum):
            self.fail(key, f"must be {_real_what(minimum, positive, maximum)}, got {_show(value)}")
        return float(value)

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        present, value = self._get(key, default)
        if present and (not isinstance(value, str) or value not in choices):
            self.fail(key, f"must be one of {choices}, got {_show(value)}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        present, value = self._get(key, default)
        if present and not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {_show(value)}")
        return value
