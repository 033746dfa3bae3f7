"""Load a released VoxCPM 2 directory unchanged (docs/design.md, "VoxCPM 2 release files and configuration").

Layout::

    config.json                       hyper-parameters ("architecture": "voxcpm2")
    model.safetensors                 everything but the AudioVAE (bf16 in the release); pytorch_model.bin accepted
    audiovae.pth | audiovae.safetensors   the AudioVAE (loaded by the AudioVAE code, always float32)
    tokenizer.json                    MiniCPM-4 tokenizer (+ tokenizer_config.json, special_tokens_map.json)

Weights are read with safetensors (or ``weights_only=True``) and loaded **strictly** (the reference ignores missing
and unexpected keys); the model is built on the ``meta`` device and takes the file's tensors, then is cast once to
the runtime dtype, so a 2B checkpoint is never held twice in float32.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from cadenza.errors import CheckpointError
from cadenza.loading import load_into, read_torch_state_dict
from cadenza.loading.release_files import ReleaseFiles
from cadenza.models.voxcpm2.config import VoxCPM2Config
from cadenza.models.voxcpm2.model import VoxCPM2Model
from cadenza.models.voxcpm2.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, VoxCPM2Tokenizer

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # first one present wins
AUDIO_VAE_FILES = ("audiovae.safetensors", "audiovae.pth")
# What a released folder must hold (the first present of each alternative is read) and what is read when present.
RELEASE_FILES = ReleaseFiles(required=((CONFIG_FILE,), WEIGHT_FILES, AUDIO_VAE_FILES, (TOKENIZER_FILE,)),
                             optional=(TOKENIZER_CONFIG_FILE,))
DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


@dataclass(frozen=True)
class VoxCPM2Files:
    directory: Path
    config: Path
    weights: Path
    audio_vae: Path
    tokenizer_dir: Path


def is_voxcpm2_dir(directory: str | Path) -> bool:
    """Cheap check (no weights read): a config.json whose architecture is voxcpm2."""
    path = Path(directory) / CONFIG_FILE
    try:
        return str(json.loads(path.read_text(encoding="utf-8")).get("architecture", "")).lower() == "voxcpm2"
    except (OSError, ValueError, AttributeError):
        return False


def config_problem(directory: str | Path) -> str | None:
    """Why a folder that holds VoxCPM 2's AudioVAE is not recognised as one (its ``config.json`` missing, not JSON,
    or without ``"architecture": "voxcpm2"``), else None: said as such, not as the CosyVoice 2 files it lacks."""
    directory = Path(directory)
    if not any((directory / name).is_file() for name in AUDIO_VAE_FILES):
        return None
    path = directory / CONFIG_FILE
    if not path.is_file():
        return f"{directory} holds a VoxCPM 2 AudioVAE but no {CONFIG_FILE}"
    try:
        arch = json.loads(path.read_text(encoding="utf-8")).get("architecture")
    except (OSError, ValueError, AttributeError) as exc:
        return f"{path} is not a readable JSON object ({str(exc)[:200]}): a VoxCPM 2 folder needs it"
    return f'{path} names architecture {arch!r}; a VoxCPM 2 folder\'s says "voxcpm2"'


def inspect_directory(directory: str | Path) -> VoxCPM2Files:
    """Check a directory holds a VoxCPM 2 checkpoint; the error lists everything that is missing."""
    d = Path(directory).expanduser()
    if not d.is_dir():
        raise CheckpointError(f"model directory not found: {d}")

    def first(names: tuple[str, ...]) -> Path | None:
        return next((d / n for n in names if (d / n).is_file()), None)

    weights, vae = first(WEIGHT_FILES), first(AUDIO_VAE_FILES)
    missing = [CONFIG_FILE] if not (d / CONFIG_FILE).is_file() else []
    missing += [] if weights else [" or ".join(WEIGHT_FILES)]
    missing += [] if vae else [" or ".join(AUDIO_VAE_FILES)]
    missing += [] if (d / TOKENIZER_FILE).is_file() else [TOKENIZER_FILE]
    if missing:
        raise CheckpointError(f"{d} is not a complete VoxCPM 2 model directory: missing {', '.join(missing)}")
    return VoxCPM2Files(d, d / CONFIG_FILE, weights, vae, d)


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device | str, config: VoxCPM2Config) -> torch.dtype:
    """Explicit ``dtype`` wins; otherwise float32 on CPU (bf16 matmuls are slow there and lose accuracy) and the
    config's dtype (bf16 in the release) on accelerators."""
    if dtype is None:
        dtype = "float32" if torch.device(device).type == "cpu" else config.dtype
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise CheckpointError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}")
        dtype = DTYPES[dtype]
    if not dtype.is_floating_point:
        raise CheckpointError(f"the model dtype must be floating point, got {dtype}")
    return dtype


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from ``.safetensors`` or a torch pickle (``weights_only=True``; ``{"state_dict": ...}`` unwrapped)."""
    if path.suffix != ".safetensors":
        return read_torch_state_dict(path)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path} (corrupt or truncated safetensors file): {exc}") from exc


def load_model(
    files: VoxCPM2Files | str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | str | None = None
) -> VoxCPM2Model:
    """Config + strictly loaded weights, in eval mode on ``device`` / ``dtype`` (see ``resolve_dtype``)."""
    files = files if isinstance(files, VoxCPM2Files) else inspect_directory(files)
    config = VoxCPM2Config.from_json(files.config)
    target = resolve_dtype(dtype, device, config)
    with torch.device("meta"):
        model = VoxCPM2Model(config)
    state = read_weights(files.weights)
    load_into(model, state, files.weights.name)
    del state  # the model now owns the tensors; the cast below replaces them one by one
    return model.to(device=device, dtype=target).eval()


@dataclass
class LoadedVoxCPM2:
    files: VoxCPM2Files
    config: VoxCPM2Config
    model: VoxCPM2Model
    tokenizer: VoxCPM2Tokenizer


def load_voxcpm2(
    directory: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
    on_unknown_chars: str = "unk",
) -> LoadedVoxCPM2:
    """Everything but the AudioVAE (its file is located in ``files.audio_vae`` for the AudioVAE loader)."""
    files = inspect_directory(directory)
    model = load_model(files, device, dtype)
    tokenizer = VoxCPM2Tokenizer(files.tokenizer_dir, on_unknown=on_unknown_chars)
    vocab = model.config.lm_config.vocab_size
    if tokenizer.vocab_size > vocab:
        # The reference loads such a folder and fails only on texts that use the extra ids: so do we (make_layout
        # refuses those texts with a clear error).
        log.warning("%s: the tokenizer has %d ids but the model embeds only %d; texts using the others are refused",
                    files.directory, tokenizer.vocab_size, vocab)
    return LoadedVoxCPM2(files, model.config, model, tokenizer)
