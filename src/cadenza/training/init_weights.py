"""Starting weights for a stage: a released / trained component file, or a Qwen2 checkpoint for the LM body.

* ``llm.pt`` / ``flow.pt`` (or a model directory holding them): loaded strictly (the LM's tied ``lm_head`` copy is
  ignored), e.g. to fine-tune the released CosyVoice2-0.5B.
* A Hugging Face Qwen2 checkpoint (``model.safetensors``, a sharded ``model.safetensors.index.json``, or a folder
  with either — e.g. ``CosyVoice-BlankEN`` or Qwen2.5-0.5B): its ``model.*`` tensors become the LM's Qwen body
  (``llm.model.model.*``); the speech embedding, decoder and markers keep their fresh initialisation. This is how
  the CosyVoice 2 LM starts from a pretrained text LLM.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from cadenza.builtin import local_model_path
from cadenza.errors import CheckpointError, InputError
from cadenza.loading import load_into, read_torch_state_dict
from cadenza.models.cosyvoice2.loader import LM_IGNORED_KEYS

QWEN_BODY_PREFIX = "llm.model."  # TextSpeechLM key = this + HF Qwen2ForCausalLM key ("model.layers.0....")


def component_file(path: str | Path, name: str, key: str = "init") -> Path:
    """The ``name`` file (``flow.pt``, ...) a config's ``key`` (``flow.init_flow``) names: a model folder holding it,
    ``cadenza-tiny`` (the built-in one), or the file itself; an ``InputError`` naming the key when there is none."""
    p = local_model_path(path)  # "cadenza-tiny": the built-in folder
    file = p / name if p.is_dir() else p
    if not file.is_file():
        raise InputError(f"{key}: {str(path)[:200]!r} is neither a model folder holding {name} nor a {name} file "
                         "(the built-in model is 'cadenza-tiny')")
    return file


def load_component(module: nn.Module, path: str | Path, name: str, reinit: Sequence[str] = (),
                   key: str = "init") -> Path:
    """Load ``name`` (``llm.pt`` / ``flow.pt``) from a file or a model directory into ``module``, strictly.

    ``reinit``: key prefixes (e.g. ``input_embedding.`` when the speech vocabulary changed) whose tensors keep the
    module's fresh initialisation; every other key must still match exactly. ``key``: the config key, for errors.
    """
    file = component_file(path, name, key)
    ignore = LM_IGNORED_KEYS if name == "llm.pt" else ()
    state = read_torch_state_dict(file)
    if reinit:
        fresh = module.state_dict()
        unknown = [p for p in reinit if not any(k.startswith(p) for k in fresh)]
        if unknown:
            raise CheckpointError(f"reinit prefixes match no parameter of the model: {unknown}")
        state = {k: v for k, v in state.items() if not any(k.startswith(p) for p in reinit)}
        state.update({k: v for k, v in fresh.items() if any(k.startswith(p) for p in reinit)})
    load_into(module, state, str(file), ignore=ignore)
    return file


def _hf_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    p = Path(path).expanduser()
    if p.is_dir():
        index = p / "model.safetensors.index.json"
        p = index if index.is_file() else p / "model.safetensors"
    if not p.is_file():
        raise CheckpointError(f"no Qwen2 checkpoint at {p} (model.safetensors or model.safetensors.index.json)")
    try:
        if p.name.endswith(".index.json"):
            files = sorted(set(json.loads(p.read_text(encoding="utf-8"))["weight_map"].values()))
            out: dict[str, torch.Tensor] = {}
            for f in files:
                out.update(load_file(str(p.parent / f)))
            return out
        return load_file(str(p))
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"cannot read Qwen2 checkpoint {p}: {exc}") from exc


def load_qwen_body(lm: nn.Module, path: str | Path) -> int:
    """Copy a HF Qwen2 checkpoint's body into ``lm`` (a ``TextSpeechLM``); returns the number of tensors loaded.

    Every body tensor of ``lm`` must be present with the same shape (the text vocabulary included).
    """
    hf = _hf_tensors(path)
    target = {k: v for k, v in lm.state_dict().items() if k.startswith(QWEN_BODY_PREFIX)}
    mapped = {QWEN_BODY_PREFIX + k: v for k, v in hf.items() if QWEN_BODY_PREFIX + k in target}
    missing = sorted(target.keys() - mapped.keys())
    wrong = [f"{k} {tuple(mapped[k].shape)} != {tuple(target[k].shape)}" for k in mapped if mapped[k].shape != target[k].shape]
    if missing or wrong:
        raise CheckpointError(f"{path} does not fit the LM's Qwen2 body: missing {missing[:8]}, shape mismatches {wrong[:8]}")
    with torch.no_grad():
        params = dict(lm.named_parameters())
        for k, v in mapped.items():
            params[k].copy_(v.to(params[k].dtype))
    return len(mapped)
