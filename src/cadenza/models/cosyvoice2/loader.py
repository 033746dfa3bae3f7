"""Load a released CosyVoice 2 directory unchanged.

Layout (docs/design.md, "CosyVoice 2 release files and loading")::

    cosyvoice2.yaml            hyper-parameters (HyperPyYAML, read as data; ``config.yaml`` is accepted too)
    llm.pt flow.pt hift.pt     state dicts (weights_only=True, strict keys)
    CosyVoice-BlankEN/         config.json (Qwen2 sizes); vocab.json + merges.txt (tokenizer, optional*)
    campplus.onnx              speaker encoder (optional*, needs the ``onnx`` extra)
    speech_tokenizer_v2.onnx   speech tokenizer (optional*, needs the ``onnx`` extra)
    spk2info.pt                saved speakers (optional)

(*) Without them the model still loads; features that need them fail with a message naming the missing file.
A file that is present is checked, however: a directory, a broken link or an empty file in place of any of these
is a ``CheckpointError`` at load, never a failure at the first request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cadenza.errors import CheckpointError
from cadenza.layers.weight_norm import fold_weight_norm
from cadenza.loading import load_into, read_torch_state_dict
from cadenza.loading.files import check_file
from cadenza.loading.release_files import ReleaseFiles
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.model import CosyVoice2Model
from cadenza.text.phonemes import PHONEMES_FILE

log = logging.getLogger(__name__)

CONFIG_NAMES = ("cosyvoice2.yaml", "config.yaml")
WEIGHT_FILES = ("llm.pt", "flow.pt", "hift.pt")
QWEN_DIR = "CosyVoice-BlankEN"
BPE_FILES = ("vocab.json", "merges.txt")
# Optional files checked when present (a directory, broken link or empty file there is an error, not "absent").
OPTIONAL_FILES = ("campplus.onnx", "speech_tokenizer_v2.onnx", "spk2info.pt", "cadenza.json",
                  f"{QWEN_DIR}/vocab.json", f"{QWEN_DIR}/merges.txt", f"{QWEN_DIR}/tokenizer_config.json",
                  f"{QWEN_DIR}/{PHONEMES_FILE}")
# What a released folder must hold and what is read when present (the hub downloads only these: not the release's
# CosyVoice-BlankEN/model.safetensors, which llm.pt overwrites, nor its TensorRT/JIT exports).
RELEASE_FILES = ReleaseFiles(required=(CONFIG_NAMES, *((n,) for n in WEIGHT_FILES), (f"{QWEN_DIR}/config.json",)),
                             optional=OPTIONAL_FILES)
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


def _present(path: Path) -> bool:
    """Something is at ``path`` (a dangling link counts: it is a broken file, not an absent one)."""
    return path.exists() or path.is_symlink()


def inspect_directory(directory: str | Path) -> CosyVoice2Files:
    """Check a directory holds a CosyVoice 2 checkpoint; the error lists everything that is missing.

    Every file that is present (required or optional) must be a non-empty regular file; the tokenizer's BPE files
    come as a pair.
    """
    d = Path(directory).expanduser()
    if not d.is_dir():
        raise CheckpointError(f"model directory not found: {d}")
    config = next((d / n for n in CONFIG_NAMES if _present(d / n)), None)
    missing = [] if config else [" or ".join(CONFIG_NAMES)]
    missing += [n for n in WEIGHT_FILES if not _present(d / n)]
    qwen_config = d / QWEN_DIR / "config.json"
    if not _present(qwen_config):
        missing.append(f"{QWEN_DIR}/config.json")
    if missing:
        raise CheckpointError(f"{d} is not a CosyVoice 2 model directory: missing {', '.join(missing)}")
    for path in (config, qwen_config, *(d / n for n in WEIGHT_FILES)):
        check_file(path, str(path.relative_to(d)))
    for rel in OPTIONAL_FILES:
        if _present(d / rel):
            check_file(d / rel, rel)

    def optional(rel: str) -> Path | None:
        return d / rel if _present(d / rel) else None

    # Text tokenizer: the Qwen2 BPE files, or a phoneme table (a model whose LM reads espeak-ng phonemes).
    bpe = [n for n in BPE_FILES if _present(d / QWEN_DIR / n)]
    if len(bpe) == 1:
        other = next(n for n in BPE_FILES if n not in bpe)
        raise CheckpointError(f"{d / QWEN_DIR} has {bpe[0]} but not {other}: the BPE tokenizer needs both")
    tok_dir = d / QWEN_DIR if bpe or _present(d / QWEN_DIR / PHONEMES_FILE) else None
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
    """Build the three networks from the config and load their weights strictly.

    Raises ``CheckpointError`` naming the file for a bad config, an unreadable or hostile weight file, and
    missing / unexpected / mis-shaped / mis-typed / non-finite tensors; nothing is returned half-loaded.
    """
    config = CosyVoice2Config.from_files(files.config, files.qwen_config)
    # Read every weight file before building: a broken one fails before any model memory is spent.
    llm_sd = read_torch_state_dict(files.weights["llm.pt"])
    flow_sd = read_torch_state_dict(files.weights["flow.pt"])
    hift_sd = read_torch_state_dict(files.weights["hift.pt"])
    # A full HiFiGan training checkpoint stores the generator under "generator." (the reference strips it too).
    hift_sd = {k.replace("generator.", ""): v for k, v in hift_sd.items() if not k.startswith("discriminator.")}
    try:
        hift_sd = fold_weight_norm(hift_sd)
    except Exception as exc:  # noqa: BLE001 - odd g/v tensors fail inside torch with its own errors
        raise CheckpointError(f"hift.pt: cannot fold its weight-norm pairs: {exc}") from exc
    # Built on the meta device: no random initialisation of ~620M parameters that the checkpoint overwrites anyway,
    # and no second copy in memory (the loaded tensors are assigned). The few tensors that are not in the
    # checkpoints (the CFM's fixed noise, the STFT window, positional tables) are created on the CPU explicitly.
    try:
        with torch.device("meta"):
            model = CosyVoice2Model(config)
    except Exception as exc:  # noqa: BLE001 - a config that passed its checks but still cannot build a module
        raise CheckpointError(f"{files.config.name}: the model cannot be built from this config: {exc}") from exc
    load_into(model.lm, llm_sd, "llm.pt", ignore=LM_IGNORED_KEYS)
    load_into(model.flow, flow_sd, "flow.pt")
    load_into(model.hift, hift_sd, "hift.pt")
    model = model.to(device=device, dtype=dtype).eval()
    for note in files.notes:
        log.info("%s: %s", files.directory, note)
    return model
