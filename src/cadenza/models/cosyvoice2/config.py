"""Typed configuration of a CosyVoice 2 model, read from the released ``cosyvoice2.yaml`` as data.

Every module size in ``models/cosyvoice2`` comes from these dataclasses; nothing is hard-coded in the
modules. ``CosyVoice2Config.official()`` gives the released CosyVoice2-0.5B hyper-parameters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadenza.errors import CheckpointError
from cadenza.models.cosyvoice2.yaml_reader import read_hyperpyyaml

# Estimator class names seen in releases (old ModelScope revisions used the non-causal name with causal: True).
KNOWN_ESTIMATOR_TAGS = ("CausalConditionalDecoder", "ConditionalDecoder")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckpointError(f"invalid CosyVoice 2 config: {msg}")


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

    def __post_init__(self) -> None:
        _check(self.hidden_size % self.num_attention_heads == 0, "hidden_size must be divisible by num_attention_heads")
        _check(self.num_attention_heads % self.num_key_value_heads == 0, "num_attention_heads must be a multiple of num_key_value_heads")
        _check(self.num_hidden_layers > 0 and self.vocab_size > 0, "Qwen2 needs layers and a vocabulary")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_json(cls, path: str | Path) -> Qwen2Config:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read Qwen2 config {path}: {exc}") from exc
        if data.get("head_dim") not in (None, data.get("hidden_size", 0) // max(1, data.get("num_attention_heads", 1))):
            raise CheckpointError(f"{path}: head_dim != hidden_size / num_attention_heads is not supported")
        names = cls.__dataclass_fields__.keys()
        try:
            return cls(**{k: data[k] for k in names if k in data})
        except TypeError as exc:
            raise CheckpointError(f"{path}: {exc}") from exc


@dataclass(frozen=True)
class SamplingConfig:
    """Repetition-aware sampling (RAS) parameters."""

    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1

    def __post_init__(self) -> None:
        _check(0 < self.top_p <= 1 and self.top_k >= 1 and self.win_size >= 1, "bad sampling parameters")


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
        _check(self.llm_input_size == self.qwen.hidden_size == self.llm_output_size,
               "llm_input_size and llm_output_size must equal the Qwen2 hidden_size")
        _check(self.speech_token_size > 0, "speech_token_size must be positive")
        _check(len(self.mix_ratio) == 2 and min(self.mix_ratio) > 0, "mix_ratio must be two positive ints")
        _check(0 <= self.min_token_text_ratio < self.max_token_text_ratio,
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
        _check(self.input_size == self.output_size, "flow encoder input_size must equal output_size")
        _check(self.output_size % self.attention_heads == 0, "encoder output_size must be divisible by attention_heads")
        _check(self.static_chunk_size > 0 and self.pre_lookahead_len >= 0, "bad encoder chunk / look-ahead")


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
        _check(len(self.channels) >= 1, "estimator needs at least one channel size")
        _check(self.static_chunk_size > 0, "estimator static_chunk_size must be positive")


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
        _check(self.t_scheduler in ("cosine", "linear"), f"unknown t_scheduler {self.t_scheduler!r}")
        _check(self.n_timesteps > 0 and self.noise_frames > 0, "bad CFM steps / noise length")


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
        _check(len(self.upsample_rates) == len(self.upsample_kernel_sizes), "upsample rates/kernels differ in length")
        _check(len(self.resblock_kernel_sizes) == len(self.resblock_dilation_sizes), "resblock kernels/dilations differ")
        _check(len(self.source_resblock_kernel_sizes) == len(self.upsample_rates), "one source resblock per upsample stage")

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
        _check(self.hift.sampling_rate == self.sample_rate == self.mel.sampling_rate, "sample rates disagree")
        _check(self.mel.hop_size == self.hift.hop_length, "mel hop must equal the vocoder's samples per frame")
        _check(self.mel.num_mels == self.flow.output_size == self.hift.in_channels, "mel bins disagree")
        _check(self.flow.vocab_size == self.lm.speech_token_size, "flow vocab_size must equal LM speech_token_size")

    @classmethod
    def official(cls) -> CosyVoice2Config:
        """The released CosyVoice2-0.5B hyper-parameters."""
        return cls()

    @classmethod
    def from_files(cls, yaml_path: str | Path, qwen_config_path: str | Path) -> CosyVoice2Config:
        return cls.from_dict(read_hyperpyyaml(yaml_path), Qwen2Config.from_json(qwen_config_path), source=str(yaml_path))

    @classmethod
    def from_dict(cls, y: dict[str, Any], qwen: Qwen2Config, source: str = "config") -> CosyVoice2Config:
        try:
            return cls._from_dict(y, qwen)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{source}: missing or malformed entry ({exc!r})") from exc

    @classmethod
    def _from_dict(cls, y: dict[str, Any], qwen: Qwen2Config) -> CosyVoice2Config:
        llm, flow, hift = y["llm"], y["flow"], y["hift"]
        enc, dec = flow["encoder"], flow["decoder"]
        est, cfm = dec["estimator"], dec.get("cfm_params", {})
        tag = str(est.get("__tag__", ""))
        if tag and tag.rsplit(".", 1)[-1] not in KNOWN_ESTIMATOR_TAGS:
            raise CheckpointError(f"unknown flow estimator class {tag!r}; expected one of {KNOWN_ESTIMATOR_TAGS}")
        token_rate = int(y.get("token_frame_rate", 25))
        ratio = int(y.get("token_mel_ratio", flow.get("token_mel_ratio", 2)))
        chunk = int(y.get("chunk_size", token_rate))
        samp = llm.get("sampling") or {}
        lm = LMConfig(
            qwen=qwen,
            llm_input_size=int(llm.get("llm_input_size", y.get("llm_input_size", qwen.hidden_size))),
            llm_output_size=int(llm.get("llm_output_size", y.get("llm_output_size", qwen.hidden_size))),
            speech_token_size=int(llm["speech_token_size"]),
            mix_ratio=tuple(int(v) for v in llm.get("mix_ratio", (5, 15))),
            sampling=SamplingConfig(**{k: samp[k] for k in ("top_p", "top_k", "win_size", "tau_r") if k in samp}),
            # Not in the release's yaml (its code fixes 2 and 20); a model trained with another text tokenizer
            # states its own speech/text length range here.
            min_token_text_ratio=float(llm.get("min_token_text_ratio", 2.0)),
            max_token_text_ratio=float(llm.get("max_token_text_ratio", 20.0)),
        )
        lookahead = int(flow.get("pre_lookahead_len", 3))
        encoder = FlowEncoderConfig(
            input_size=int(enc.get("input_size", flow["input_size"])),
            output_size=int(enc["output_size"]),
            attention_heads=int(enc["attention_heads"]),
            linear_units=int(enc["linear_units"]),
            num_blocks=int(enc["num_blocks"]),
            upsample_stride=ratio,
            pre_lookahead_len=lookahead,
            static_chunk_size=int(enc.get("static_chunk_size") or chunk),
        )
        estimator = EstimatorConfig(
            in_channels=int(est["in_channels"]),
            out_channels=int(est["out_channels"]),
            channels=tuple(int(c) for c in est["channels"]),
            attention_head_dim=int(est["attention_head_dim"]),
            n_blocks=int(est["n_blocks"]),
            num_mid_blocks=int(est["num_mid_blocks"]),
            num_heads=int(est["num_heads"]),
            static_chunk_size=int(est.get("static_chunk_size") or chunk * ratio),
            num_decoding_left_chunks=int(est.get("num_decoding_left_chunks", -1)),
        )
        cfm_cfg = CFMConfig(
            sigma_min=float(cfm.get("sigma_min", 1e-6)),
            t_scheduler=str(cfm.get("t_scheduler", "cosine")),
            training_cfg_rate=float(cfm.get("training_cfg_rate", 0.2)),
            inference_cfg_rate=float(cfm.get("inference_cfg_rate", 0.7)),
        )
        flow_cfg = FlowConfig(
            vocab_size=int(flow["vocab_size"]),
            input_size=int(flow["input_size"]),
            output_size=int(flow["output_size"]),
            spk_embed_dim=int(flow.get("spk_embed_dim", y.get("spk_embed_dim", 192))),
            token_mel_ratio=ratio,
            pre_lookahead_len=lookahead,
            encoder=encoder,
            estimator=estimator,
            cfm=cfm_cfg,
        )
        istft = hift.get("istft_params", {})
        f0 = hift.get("f0_predictor", {})
        hift_cfg = HiFTConfig(
            in_channels=int(hift["in_channels"]),
            base_channels=int(hift["base_channels"]),
            nb_harmonics=int(hift["nb_harmonics"]),
            sampling_rate=int(hift["sampling_rate"]),
            nsf_alpha=float(hift["nsf_alpha"]),
            nsf_sigma=float(hift["nsf_sigma"]),
            nsf_voiced_threshold=float(hift["nsf_voiced_threshold"]),
            upsample_rates=tuple(int(v) for v in hift["upsample_rates"]),
            upsample_kernel_sizes=tuple(int(v) for v in hift["upsample_kernel_sizes"]),
            istft_n_fft=int(istft.get("n_fft", 16)),
            istft_hop_len=int(istft.get("hop_len", 4)),
            resblock_kernel_sizes=tuple(int(v) for v in hift["resblock_kernel_sizes"]),
            resblock_dilation_sizes=tuple(tuple(int(d) for d in ds) for ds in hift["resblock_dilation_sizes"]),
            source_resblock_kernel_sizes=tuple(int(v) for v in hift["source_resblock_kernel_sizes"]),
            source_resblock_dilation_sizes=tuple(tuple(int(d) for d in ds) for ds in hift["source_resblock_dilation_sizes"]),
            lrelu_slope=float(hift.get("lrelu_slope", 0.1)),
            audio_limit=float(hift.get("audio_limit", 0.99)),
            f0_cond_channels=int(f0.get("cond_channels", hift["base_channels"])),
            f0_num_class=int(f0.get("num_class", 1)),
        )
        fe = y.get("feat_extractor") or {}
        mel = MelConfig(
            n_fft=int(fe.get("n_fft", 1920)),
            num_mels=int(fe.get("num_mels", 80)),
            sampling_rate=int(fe.get("sampling_rate", y.get("sample_rate", 24000))),
            hop_size=int(fe.get("hop_size", 480)),
            win_size=int(fe.get("win_size", 1920)),
            fmin=float(fe.get("fmin", 0)),
            fmax=None if fe.get("fmax", 8000) is None else float(fe.get("fmax", 8000)),
            center=bool(fe.get("center", False)),
        )
        return cls(
            sample_rate=int(y.get("sample_rate", 24000)),
            token_frame_rate=token_rate,
            token_mel_ratio=ratio,
            chunk_size=chunk,
            lm=lm,
            flow=flow_cfg,
            hift=hift_cfg,
            mel=mel,
        )
