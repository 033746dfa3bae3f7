"""The ``model:`` section of a training config, and writing ``cosyvoice2.yaml`` + ``CosyVoice-BlankEN/config.json``.

``model:`` takes one of::

    model: {dir: /path/CosyVoice2-0.5B}            # a released or assembled model directory
    model:
      config: official | path/to/cosyvoice2.yaml | {mapping in the yaml's structure}
      qwen: official | path/to/config.json | {Qwen2 config keys}
      overrides: {nested mapping merged over config}   # e.g. a tiny model for tests
      tokenizer: path/to/CosyVoice-BlankEN            # optional: vocab.json + merges.txt (copied on export)

Relative paths are relative to the working directory. Exports always write the canonical, tag-free yaml produced
by ``cosyvoice2_yaml`` (read back by the inference loader to the same ``CosyVoice2Config``; ``check_writable``
fails early for a config the yaml cannot express).
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cadenza.builtin import local_model_path
from cadenza.errors import CheckpointError, InputError
from cadenza.models.cosyvoice2.config import CosyVoice2Config, Qwen2Config
from cadenza.models.cosyvoice2.loader import CONFIG_NAMES, QWEN_DIR
from cadenza.models.cosyvoice2.yaml_reader import read_hyperpyyaml
from cadenza.text.phonemes import PHONEMES_FILE

YAML_NAME = "cosyvoice2.yaml"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "phonemes.json")


@dataclass(frozen=True)
class ModelSource:
    config: CosyVoice2Config
    model_dir: Path | None = None  # set when built from model.dir (its weights can initialise a stage)
    tokenizer_dir: Path | None = None


def cosyvoice2_yaml(cfg: CosyVoice2Config) -> dict[str, Any]:
    """The config in the released yaml's structure (plain data, no tags)."""
    lm, flow, hift, mel = cfg.lm, cfg.flow, cfg.hift, cfg.mel
    enc, est, cfm = flow.encoder, flow.estimator, flow.cfm
    return {
        "sample_rate": cfg.sample_rate, "token_frame_rate": cfg.token_frame_rate, "token_mel_ratio": cfg.token_mel_ratio,
        "chunk_size": cfg.chunk_size, "num_decoding_left_chunks": est.num_decoding_left_chunks,
        "spk_embed_dim": flow.spk_embed_dim,
        "llm": {"speech_token_size": lm.speech_token_size, "mix_ratio": list(lm.mix_ratio),
                "sampling": asdict(lm.sampling), "min_token_text_ratio": lm.min_token_text_ratio,
                "max_token_text_ratio": lm.max_token_text_ratio},
        "flow": {
            "input_size": flow.input_size, "output_size": flow.output_size, "spk_embed_dim": flow.spk_embed_dim,
            "vocab_size": flow.vocab_size, "token_mel_ratio": flow.token_mel_ratio, "input_frame_rate": cfg.token_frame_rate,
            "pre_lookahead_len": flow.pre_lookahead_len,
            "encoder": {"input_size": enc.input_size, "output_size": enc.output_size, "attention_heads": enc.attention_heads,
                        "linear_units": enc.linear_units, "num_blocks": enc.num_blocks,
                        "static_chunk_size": enc.static_chunk_size},
            "decoder": {
                "cfm_params": {"sigma_min": cfm.sigma_min, "t_scheduler": cfm.t_scheduler,
                               "training_cfg_rate": cfm.training_cfg_rate, "inference_cfg_rate": cfm.inference_cfg_rate,
                               # a Cadenza key: written only when set, so release-shaped configs stay as they were
                               **({"inference_temperature": cfm.inference_temperature}
                                  if cfm.inference_temperature != 1.0 else {}),
                               **({"n_timesteps": cfm.n_timesteps} if cfm.n_timesteps != 10 else {})},
                "estimator": {"in_channels": est.in_channels, "out_channels": est.out_channels,
                              "channels": list(est.channels), "attention_head_dim": est.attention_head_dim,
                              "n_blocks": est.n_blocks, "num_mid_blocks": est.num_mid_blocks, "num_heads": est.num_heads,
                              "static_chunk_size": est.static_chunk_size,
                              "num_decoding_left_chunks": est.num_decoding_left_chunks},
            },
        },
        "hift": {
            "in_channels": hift.in_channels, "base_channels": hift.base_channels, "nb_harmonics": hift.nb_harmonics,
            "sampling_rate": hift.sampling_rate, "nsf_alpha": hift.nsf_alpha, "nsf_sigma": hift.nsf_sigma,
            "nsf_voiced_threshold": hift.nsf_voiced_threshold, "upsample_rates": list(hift.upsample_rates),
            "upsample_kernel_sizes": list(hift.upsample_kernel_sizes),
            "istft_params": {"n_fft": hift.istft_n_fft, "hop_len": hift.istft_hop_len},
            "resblock_kernel_sizes": list(hift.resblock_kernel_sizes),
            "resblock_dilation_sizes": [list(d) for d in hift.resblock_dilation_sizes],
            "source_resblock_kernel_sizes": list(hift.source_resblock_kernel_sizes),
            "source_resblock_dilation_sizes": [list(d) for d in hift.source_resblock_dilation_sizes],
            "lrelu_slope": hift.lrelu_slope, "audio_limit": hift.audio_limit,
            "f0_predictor": {"num_class": hift.f0_num_class, "in_channels": hift.in_channels,
                             "cond_channels": hift.f0_cond_channels},
        },
        "feat_extractor": {"n_fft": mel.n_fft, "num_mels": mel.num_mels, "sampling_rate": mel.sampling_rate,
                           "hop_size": mel.hop_size, "win_size": mel.win_size, "fmin": mel.fmin, "fmax": mel.fmax,
                           "center": mel.center},
    }


def qwen_json(qwen: Qwen2Config) -> dict[str, Any]:
    """``CosyVoice-BlankEN/config.json`` for the Qwen2 body (the keys HF's ``Qwen2Config`` reads)."""
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
            "torch_dtype": "float32", "use_sliding_window": False, "attention_dropout": 0.0, **asdict(qwen)}


def check_writable(cfg: CosyVoice2Config) -> None:
    """Fail early if ``cfg`` would not survive the trip through ``cosyvoice2.yaml`` (fields the yaml cannot hold)."""
    back = CosyVoice2Config.from_dict(cosyvoice2_yaml(cfg), cfg.lm.qwen)
    if back != cfg:
        raise InputError("this model config cannot be written to cosyvoice2.yaml (the release format fixes "
                         "num_up_blocks, the CFM noise and the LM length ratios): keep their defaults")


def _deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _yaml_source(value: Any) -> dict[str, Any]:
    if value in (None, "official"):
        return cosyvoice2_yaml(CosyVoice2Config.official())
    if isinstance(value, dict):
        return value
    return read_hyperpyyaml(Path(value).expanduser())


def _qwen_source(value: Any) -> Qwen2Config:
    if value in (None, "official"):
        return Qwen2Config()
    if isinstance(value, dict):
        known = Qwen2Config.__dataclass_fields__.keys()
        return Qwen2Config(**{k: v for k, v in value.items() if k in known})
    return Qwen2Config.from_json(Path(value).expanduser())


def resolve_model(section: dict[str, Any] | None) -> ModelSource:
    """Build the model config named by a stage config's ``model:`` section (see the module docstring)."""
    section = dict(section or {})
    try:
        if section.get("dir"):
            d = local_model_path(section["dir"])  # "cadenza-tiny": the built-in folder
            yaml_path = next((d / n for n in CONFIG_NAMES if (d / n).is_file()), None)
            if yaml_path is None or not (d / QWEN_DIR / "config.json").is_file():
                raise InputError(f"model.dir {d} needs {' or '.join(CONFIG_NAMES)} and {QWEN_DIR}/config.json")
            y = _deep_merge(read_hyperpyyaml(yaml_path), section.get("overrides") or {})
            cfg = CosyVoice2Config.from_dict(y, Qwen2Config.from_json(d / QWEN_DIR / "config.json"), str(yaml_path))
            tok = d / QWEN_DIR if any((d / QWEN_DIR / n).is_file() for n in ("vocab.json", PHONEMES_FILE)) else None
            return ModelSource(cfg, d, Path(section["tokenizer"]) if section.get("tokenizer") else tok)
        y = _deep_merge(_yaml_source(section.get("config")), section.get("overrides") or {})
        cfg = CosyVoice2Config.from_dict(y, _qwen_source(section.get("qwen")), "model.config")
    except CheckpointError as exc:
        raise InputError(f"training config [model]: {exc}") from exc
    tokenizer = Path(section["tokenizer"]).expanduser() if section.get("tokenizer") else None
    return ModelSource(cfg, None, tokenizer)


def write_model_config(out_dir: str | Path, cfg: CosyVoice2Config, tokenizer_dir: Path | None = None) -> None:
    """Write ``cosyvoice2.yaml`` and ``CosyVoice-BlankEN/config.json`` (+ the tokenizer files, if known)."""
    import yaml

    out = Path(out_dir)
    blank = out / QWEN_DIR
    blank.mkdir(parents=True, exist_ok=True)
    (out / YAML_NAME).write_text(yaml.safe_dump(cosyvoice2_yaml(cfg), sort_keys=False), encoding="utf-8")
    (blank / "config.json").write_text(json.dumps(qwen_json(cfg.lm.qwen), indent=2), encoding="utf-8")
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / name
            if src.is_file() and src.resolve() != (blank / name).resolve():
                shutil.copyfile(src, blank / name)
