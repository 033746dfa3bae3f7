"""Typed configuration of a CosyVoice 2 model, read from the released ``cosyvoice2.yaml`` as data.

Every module size in ``models/cosyvoice2`` comes from these dataclasses; nothing is hard-coded in the
modules. ``CosyVoice2Config.official()`` gives the released CosyVoice2-0.5B hyper-parameters.

Reading is strict: a wrong type, a wrong sign, a missing required key or an unknown class / scheduler name is a
``CheckpointError`` that names the file and the dotted key, e.g.
``cosyvoice2.yaml: flow.output_size must be a positive integer, got -80``. The dataclasses check themselves too
(types, signs, and the sizes that must agree), so a config built in code is held to the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadenza.errors import CheckpointError
from cadenza.loading.files import read_json_object
from cadenza.models.cosyvoice2.config_checks import (
    InvalidConfig,
    check_int_tuple,
    check_ints,
    check_is,
    check_reals,
    is_int,
    is_real,
    require,
    show,
)
from cadenza.models.cosyvoice2.config_yaml import YamlSection
from cadenza.models.cosyvoice2.yaml_reader import read_hyperpyyaml

# Estimator class names seen in releases (old ModelScope revisions used the non-causal name with causal: True).
KNOWN_ESTIMATOR_TAGS = ("CausalConditionalDecoder", "ConditionalDecoder")
T_SCHEDULERS = ("cosine", "linear")
# Sizes that allocate real memory while the model is built, before the weights are compared with it (the CFM's
# fixed noise is 15000 x mel bins, the vocoder's STFT window n_fft): bounded so a wrong config cannot exhaust RAM.
MAX_MEL_BINS = 1024
MAX_FFT = 1 << 16


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
        check_ints(self, ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "intermediate_size", "vocab_size", "max_position_embeddings"))
        check_reals(self, ("rope_theta", "rms_norm_eps"), positive=True)
        require(isinstance(self.tie_word_embeddings, bool), "Qwen2Config.tie_word_embeddings must be true or false")
        require(self.hidden_size % self.num_attention_heads == 0, "hidden_size must be divisible by num_attention_heads")
        require(self.num_attention_heads % self.num_key_value_heads == 0,
               "num_attention_heads must be a multiple of num_key_value_heads")
        require(self.head_dim % 2 == 0, "head_dim (hidden_size / num_attention_heads) must be even for RoPE")

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
                    raise CheckpointError(f"{path}: {key} must be true or false, got {show(v)}")
            elif fields_[key].type == "float":
                if not (is_real(v) and v > 0):
                    raise CheckpointError(f"{path}: {key} must be a positive number, got {show(v)}")
            elif not (is_int(v) and v > 0):
                raise CheckpointError(f"{path}: {key} must be a positive integer, got {show(v)}")
            values[key] = v
        head_dim = data.get("head_dim")
        if head_dim is not None and head_dim != values["hidden_size"] // values["num_attention_heads"]:
            raise CheckpointError(f"{path}: head_dim {show(head_dim)} != hidden_size / num_attention_heads is not "
                                  "supported")
        try:
            return cls(**values)
        except InvalidConfig as exc:
            raise CheckpointError(f"{path}: {exc}") from exc


@dataclass(frozen=True)
class SamplingConfig:
    """Repetition-aware sampling (RAS) parameters."""

    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1

    def __post_init__(self) -> None:
        check_ints(self, ("top_k", "win_size"))
        check_reals(self, ("top_p",), positive=True, maximum=1.0)
        check_reals(self, ("tau_r",))


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
        check_is(self, "qwen", Qwen2Config)
        check_is(self, "sampling", SamplingConfig)
        check_ints(self, ("llm_input_size", "llm_output_size", "speech_token_size"))
        check_int_tuple(self, "mix_ratio", length=2)
        check_reals(self, ("min_token_text_ratio", "max_token_text_ratio"))
        require(self.llm_input_size == self.qwen.hidden_size == self.llm_output_size,
               "llm_input_size and llm_output_size must equal the Qwen2 hidden_size")
        require(self.min_token_text_ratio < self.max_token_text_ratio,
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
        check_ints(self, ("input_size", "output_size", "attention_heads", "linear_units", "num_blocks", "num_up_blocks",
                     "upsample_stride", "static_chunk_size"))
        check_ints(self, ("pre_lookahead_len",), minimum=0)
        require(self.input_size == self.output_size, "flow encoder input_size must equal output_size")
        require(self.output_size % self.attention_heads == 0, "encoder output_size must be divisible by attention_heads")


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
        check_ints(self, ("in_channels", "out_channels", "attention_head_dim", "n_blocks", "num_mid_blocks", "num_heads",
                     "static_chunk_size"))
        check_ints(self, ("num_decoding_left_chunks",), minimum=None)
        check_int_tuple(self, "channels")


@dataclass(frozen=True)
class CFMConfig:
    """Conditional flow matching sampler (Euler, cosine schedule, CFG, fixed noise)."""

    sigma_min: float = 1e-6
    t_scheduler: str = "cosine"
    training_cfg_rate: float = 0.2
    inference_cfg_rate: float = 0.7
    # Euler steps at inference (the release: 10, fixed in its code). A Cadenza key of ``cfm_params``: cadenza-tiny
    # ships 7 (the same words, a little more natural, 30 % less flow compute; docs/cadenza-tiny.md, "Quality").
    n_timesteps: int = 10
    noise_frames: int = 15000  # the fixed noise buffer: 300 s of mel frames
    noise_seed: int = 0
    # Scale of the starting noise at inference (Grad-TTS / Matcha-TTS's temperature; a Cadenza key of
    # ``cfm_params``, absent from the release's yaml: 1.0 there, as the reference samples). Below 1 the ODE starts
    # nearer the condition's mean: fewer slips of a small flow, less variety (docs/cadenza-tiny.md, "Quality").
    inference_temperature: float = 1.0

    def __post_init__(self) -> None:
        require(self.t_scheduler in T_SCHEDULERS, f"unknown t_scheduler {self.t_scheduler!r} (one of {T_SCHEDULERS})")
        check_reals(self, ("sigma_min", "inference_cfg_rate"))
        check_reals(self, ("inference_temperature",), minimum=0.0, maximum=2.0)
        check_reals(self, ("training_cfg_rate",), maximum=1.0)
        check_ints(self, ("n_timesteps", "noise_frames"))
        check_ints(self, ("noise_seed",), minimum=0)


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
            check_is(self, name, cls)
        check_ints(self, ("vocab_size", "input_size", "output_size", "spk_embed_dim", "token_mel_ratio"))
        check_ints(self, ("pre_lookahead_len",), minimum=0)
        require(self.output_size <= MAX_MEL_BINS, f"flow output_size (mel bins) {self.output_size} > {MAX_MEL_BINS}")
        require(self.encoder.input_size == self.input_size, "flow input_size must equal the encoder input_size")
        require(self.estimator.in_channels == 4 * self.output_size, "estimator in_channels must be 4 x mel bins (x, mu, spk, cond)")
        require(self.estimator.out_channels == self.output_size, "estimator out_channels must equal the mel bins")
        require(self.encoder.upsample_stride == self.token_mel_ratio, "encoder upsampling must equal token_mel_ratio")


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
        check_ints(self, ("in_channels", "base_channels", "sampling_rate", "istft_n_fft", "istft_hop_len",
                     "f0_cond_channels", "f0_num_class"))
        check_ints(self, ("nb_harmonics",), minimum=0)
        check_reals(self, ("nsf_alpha", "nsf_sigma", "nsf_voiced_threshold", "lrelu_slope"))
        check_reals(self, ("audio_limit",), positive=True)
        for name in ("upsample_rates", "upsample_kernel_sizes", "resblock_kernel_sizes", "source_resblock_kernel_sizes"):
            check_int_tuple(self, name)
        for name in ("resblock_dilation_sizes", "source_resblock_dilation_sizes"):
            check_int_tuple(self, name, nested=True)
        require(self.istft_n_fft <= MAX_FFT, f"hift istft n_fft {self.istft_n_fft} > {MAX_FFT}")
        require(self.istft_hop_len <= self.istft_n_fft, "hift istft hop_len must not exceed n_fft")
        require(len(self.upsample_rates) == len(self.upsample_kernel_sizes), "upsample rates/kernels differ in length")
        require(len(self.resblock_kernel_sizes) == len(self.resblock_dilation_sizes), "resblock kernels/dilations differ")
        require(len(self.source_resblock_kernel_sizes) == len(self.upsample_rates), "one source resblock per upsample stage")
        require(len(self.source_resblock_dilation_sizes) == len(self.source_resblock_kernel_sizes),
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
        check_ints(self, ("n_fft", "num_mels", "sampling_rate", "hop_size", "win_size"))
        check_reals(self, ("fmin",))
        if self.fmax is not None:
            check_reals(self, ("fmax",), positive=True)
            require(self.fmin < self.fmax, "mel fmin must be below fmax")
        require(isinstance(self.center, bool), "MelConfig.center must be true or false")
        require(self.n_fft <= MAX_FFT and self.num_mels <= MAX_MEL_BINS,
               f"mel n_fft must be <= {MAX_FFT} and num_mels <= {MAX_MEL_BINS}")
        require(self.win_size <= self.n_fft, "mel win_size must not exceed n_fft")


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
            check_is(self, name, cls)
        check_ints(self, ("sample_rate", "token_frame_rate", "token_mel_ratio", "chunk_size"))
        require(self.hift.sampling_rate == self.sample_rate == self.mel.sampling_rate, "sample rates disagree")
        require(self.mel.hop_size == self.hift.hop_length, "mel hop must equal the vocoder's samples per frame")
        require(self.mel.num_mels == self.flow.output_size == self.hift.in_channels, "mel bins disagree")
        require(self.flow.vocab_size == self.lm.speech_token_size, "flow vocab_size must equal LM speech_token_size")
        require(self.flow.token_mel_ratio == self.token_mel_ratio, "flow token_mel_ratio must equal token_mel_ratio")

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
            return cls._from_dict(YamlSection(y, source), qwen)
        except InvalidConfig as exc:  # a check across values: the file is named here, keys in the message
            raise CheckpointError(f"{source}: {exc}") from exc

    @classmethod
    def _from_dict(cls, r: YamlSection, qwen: Qwen2Config) -> CosyVoice2Config:
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
            inference_temperature=cfm.real("inference_temperature", 1.0, maximum=2.0),
            n_timesteps=cfm.integer("n_timesteps", 10),
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


