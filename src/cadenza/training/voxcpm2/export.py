"""What a VoxCPM 2 fine-tuning run leaves behind, in the release's formats (docs/voxcpm2.md, "Fine-tuning VoxCPM 2").

* LoRA: ``lora_weights.safetensors`` (every ``<module>.lora_A`` / ``lora_B``) + ``lora_config.json`` =
  ``{"base_model": ..., "lora_config": {...}}``, the reference trainer's files; ``cadenza synth --lora DIR``,
  ``VoxCPM2.from_pretrained(model, lora=DIR)`` and the reference's ``load_lora_weights`` read them.
* full: a model folder in the release layout: ``model.safetensors`` (every weight but the AudioVAE's, release names)
  beside copies of ``config.json``, the AudioVAE file and the tokenizer files of the source folder.
* ``merge_lora_dir``: an adapter folded into its base weights, written as such a model folder (adapter-free
  inference, and a start for further full fine-tuning).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from cadenza.errors import CheckpointError, InputError
from cadenza.models.voxcpm2 import lora as lora_ops
from cadenza.models.voxcpm2.loader import VoxCPM2Files, inspect_directory, load_model

COPIED_FILES = ("config.json", "audiovae.pth", "audiovae.safetensors", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json")
_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Atomic write (temporary file + rename) of CPU-contiguous copies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_lora_dir(model: torch.nn.Module, config: lora_ops.LoRAConfig, out: str | Path,
                   base_model: str | None = None) -> Path:
    """The model's adapters as ``out/lora_weights.safetensors`` + ``out/lora_config.json``."""
    return write_lora_weights(lora_ops.lora_state_dict(model), config, out, base_model)


def write_lora_weights(state: dict[str, torch.Tensor], config: lora_ops.LoRAConfig, out: str | Path,
                       base_model: str | None = None) -> Path:
    """Adapter tensors (``lora_state_dict``'s names) as ``out/lora_weights.safetensors`` + ``lora_config.json``."""
    out = Path(out)
    if not state:
        raise InputError("the model has no LoRA layers to write")
    _save_safetensors(state, out / lora_ops.WEIGHT_FILES[0])
    doc = {"base_model": base_model,
           "lora_config": {k: list(v) if isinstance(v, tuple) else v for k, v in config.__dict__.items()}}
    (out / lora_ops.CONFIG_FILE).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def source_dtype(files: VoxCPM2Files) -> torch.dtype:
    """The dtype of the source folder's weights (bf16 in the release), read from the safetensors header."""
    if files.weights.suffix != ".safetensors":
        return torch.float32
    from safetensors import safe_open

    with safe_open(str(files.weights), "pt") as f:
        name = next(iter(f.keys()))
        return _SAFETENSORS_DTYPES.get(f.get_slice(name).get_dtype(), torch.float32)


def write_model_dir(state: dict[str, torch.Tensor], source: VoxCPM2Files, out: str | Path,
                    dtype: torch.dtype | None = None) -> Path:
    """``state`` (release names, no ``lora_`` keys) as ``out/model.safetensors`` (in ``dtype``, default as given),
    plus the source folder's config, AudioVAE and tokenizer files."""
    out = Path(out)
    if out.resolve() == source.directory.resolve():
        raise InputError("the exported model folder must differ from the source folder")
    if any(".lora_" in k for k in state):
        raise InputError("merge or remove the LoRA layers before writing a model folder")
    out.mkdir(parents=True, exist_ok=True)
    _save_safetensors({k: v.to(dtype) if dtype is not None else v for k, v in state.items()}, out / "model.safetensors")
    for name in COPIED_FILES:
        if (source.directory / name).is_file():
            shutil.copyfile(source.directory / name, out / name)
    return out


def merge_lora_dir(base: str | Path, adapter: str | Path, out: str | Path, dtype: torch.dtype | None = None,
                   verify: bool = True) -> Path:
    """Fold the adapter of ``adapter`` (a LoRA folder) into the weights of the model folder ``base``; write the
    result as the model folder ``out``. ``dtype`` None: the base file's dtype (bf16 for the release). The merge runs
    in float32 on the CPU. ``verify`` loads ``out`` back strictly."""
    files = inspect_directory(base)
    dtype = dtype or source_dtype(files)
    model = load_model(files, "cpu", torch.float32)
    lora_ops.load_lora(model, adapter)
    lora_ops.merge_lora(model)
    lora_ops.remove_lora(model, keep_merged=True)
    write_model_dir(model.state_dict(), files, out, dtype)
    if verify:
        try:
            load_model(Path(out), "cpu", torch.float32)
        except CheckpointError as exc:
            raise CheckpointError(f"the merged folder {out} does not load: {exc}") from exc
    return Path(out)
