"""Load a released CosyVoice 2 directory unchanged.

Layout (spec §1)::

    cosyvoice2.yaml            hyper-parameters (HyperPyYAML, read as data; ``config.yaml`` is accepted too)
    llm.pt flow.pt hift.pt     state dicts (weights_only=True, strict keys)
    CosyVoice-BlankEN/         config.json (Qwen2 sizes); vocab.json + merges.txt (tokenizer, optional*)
    campplus.onnx              speaker encoder (optional*, needs the ``onnx`` extra)
    speech_tokenizer_v2.onnx   speech tokenizer (optional*, needs the ``onnx`` extra)
    spk2info.pt                saved speakers (optional)

(*) Without them the model still loads; features that need them fail with a message naming the missing file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cadenza.errors import CheckpointError
from cadenza.layers.weight_norm import fold_weight_norm
from cadenza.loading import load_into, read_torch_state_dict
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.model import CosyVoice2Model
from cadenza.text.phonemes import PHONEMES_FILE

log = logging.getLogger(__name__)

CONFIG_NAMES = ("cosyvoice2.yaml", "config.yaml")
WEIGHT_FILES = ("llm.pt", "flow.pt", "hift.pt")
QWEN_DIR = "CosyVoice-BlankEN"
# Tied to embed_tokens and never used: CosyVoice 2 reads Qwen's last hidden state, not its text logits.
LM_IGNORED_KEYS = ("llm.model.lm_head.weight",)


@dataclass(frozen=True)
class CosyVoice2Files:
    """The files of a checkpoint directory; optional ones are ``None`` when absent."""

    directory: Path
    config: Path
    qwen_config: Path
    weights: dict[str, Path]
    tokenizer_dir: Path | None = None
    campplus: Path | None = None
    speech_tokenizer: Path | None = None
    spk2info: Path | None = None
    notes: list[str] = field(default_factory=list)


def is_cosyvoice2_dir(directory: str | Path) -> bool:
    d = Path(directory)
    return any((d / n).is_file() for n in CONFIG_NAMES) and (d / "llm.pt").is_file() and (d / "flow.pt").is_file()


def inspect_directory(directory: str | Path) -> CosyVoice2Files:
    """Check a directory holds a CosyVoice 2 checkpoint; the error lists everything that is missing."""
    d = Path(directory).expanduser()
    if not d.is_dir():
        raise CheckpointError(f"model directory not found: {d}")
    config = next((d / n for n in CONFIG_NAMES if (d / n).is_file()), None)
    missing = [] if config else [" or ".join(CONFIG_NAMES)]
    missing += [n for n in WEIGHT_FILES if not (d / n).is_file()]
    qwen_config = d / QWEN_DIR / "config.json"
    if not qwen_config.is_file():
        missing.append(f"{QWEN_DIR}/config.json")
    if missing:
        raise CheckpointError(f"{d} is not a CosyVoice 2 model directory: missing {', '.join(missing)}")

    def optional(rel: str) -> Path | None:
        return d / rel if (d / rel).exists() else None

    # Text tokenizer: the Qwen2 BPE files, or a phoneme table (a model whose LM reads espeak-ng phonemes).
    bpe = (d / QWEN_DIR / "vocab.json").is_file() and (d / QWEN_DIR / "merges.txt").is_file()
    tok_dir = d / QWEN_DIR if bpe or (d / QWEN_DIR / PHONEMES_FILE).is_file() else None
    files = CosyVoice2Files(
        directory=d, config=config, qwen_config=qwen_config, weights={n: d / n for n in WEIGHT_FILES},
        tokenizer_dir=tok_dir, campplus=optional("campplus.onnx"),
        speech_tokenizer=optional("speech_tokenizer_v2.onnx"), spk2info=optional("spk2info.pt"),
    )
    for what, path in (("text tokenizer (vocab.json/merges.txt)", tok_dir), ("campplus.onnx", files.campplus),
                       ("speech_tokenizer_v2.onnx", files.speech_tokenizer)):
        if path is None:
            files.notes.append(f"{what} absent")
    return files


def load_cosyvoice2_weights(
    files: CosyVoice2Files, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> CosyVoice2Model:
    """Build the three networks from the config and load their weights strictly."""
    config = CosyVoice2Config.from_files(files.config, files.qwen_config)
    # Built on the meta device: no random initialisation of ~620M parameters that the checkpoint overwrites anyway,
    # and no second copy in memory (the loaded tensors are assigned). The few tensors that are not in the
    # checkpoints (the CFM's fixed noise, the STFT window, positional tables) are created on the CPU explicitly.
    with torch.device("meta"):
        model = CosyVoice2Model(config)
    load_into(model.lm, read_torch_state_dict(files.weights["llm.pt"]), "llm.pt", ignore=LM_IGNORED_KEYS)
    load_into(model.flow, read_torch_state_dict(files.weights["flow.pt"]), "flow.pt")
    hift_sd = read_torch_state_dict(files.weights["hift.pt"])
    # A full HiFiGan training checkpoint stores the generator under "generator." (the reference strips it too).
    hift_sd = {k.replace("generator.", ""): v for k, v in hift_sd.items() if not k.startswith("discriminator.")}
    load_into(model.hift, fold_weight_norm(hift_sd), "hift.pt")
    model = model.to(device=device, dtype=dtype).eval()
    for note in files.notes:
        log.info("%s: %s", files.directory, note)
    return model
