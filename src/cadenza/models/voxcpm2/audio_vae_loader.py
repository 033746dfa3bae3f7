"""Load the released AudioVAE V2 weights (``audiovae.safetensors`` or ``audiovae.pth``) strictly.

The release stores ``torch.save({"state_dict": {...}})`` with 312 entries (docs/design.md,
"VoxCPM 2 release files and configuration"): every conv as ``X.bias`` / ``X.weight_g`` / ``X.weight_v`` (legacy weight
norm; the newer ``parametrizations`` naming is accepted too), Snake ``alpha`` as ``[1, C, 1]`` and the int32 buffer
``decoder.sr_bin_boundaries``. Keys are checked against the model built from the config *in the file's naming*, so an
error lists missing / unexpected / mis-shaped keys as they appear in the file; then weight norm is folded and ``alpha``
flattened to our ``[C]`` layout. As in the reference, ``audiovae.safetensors`` takes priority over ``audiovae.pth`` in a
model directory.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from cadenza.errors import CheckpointError
from cadenza.layers.snake import Snake
from cadenza.layers.weight_norm import LEGACY_G, LEGACY_V, PARAM_G, PARAM_V, fold_weight_norm, weight_norm_key_shapes
from cadenza.loading import load_into, read_torch_state_dict
from cadenza.loading.state_dict import key_listing
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig

log = logging.getLogger(__name__)

WEIGHT_FILES = ("audiovae.safetensors", "audiovae.pth")  # priority order of the reference loader
CONFIG_FILE = "config.json"


def weight_norm_module_names(vae: nn.Module) -> list[str]:
    """Every conv of the AudioVAE: the reference wraps each one in ``weight_norm``."""
    return [name for name, m in vae.named_modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]


def _snake_alpha_keys(vae: nn.Module) -> set[str]:
    return {f"{name}.alpha" for name, m in vae.named_modules() if isinstance(m, Snake)}


def checkpoint_key_shapes(vae: AudioVAE) -> dict[str, torch.Size]:
    """The entries (name -> shape) of the release's ``audiovae.pth`` for a model built from the same config.

    Weight-normalised convs appear as ``bias``, ``weight_g`` ``[d0, 1, 1]``, ``weight_v``; Snake ``alpha`` as
    ``[1, C, 1]``. Works on the ``meta`` device.
    """
    alphas = _snake_alpha_keys(vae)
    plain = {k: (torch.Size([1, v.shape[0], 1]) if k in alphas else v.shape) for k, v in vae.state_dict().items()}
    return weight_norm_key_shapes(plain, weight_norm_module_names(vae), legacy=True)


def _legacy_name(key: str) -> str:
    for new, old in ((PARAM_G, LEGACY_G), (PARAM_V, LEGACY_V)):
        if key.endswith(new):
            return key[: -len(new)] + old
    return key


def check_checkpoint_keys(vae: AudioVAE, state_dict: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise :class:`CheckpointError` unless ``state_dict`` has exactly the release's keys and shapes for ``vae``."""
    expected = checkpoint_key_shapes(vae)
    given = {_legacy_name(k): v for k, v in state_dict.items()}
    missing = expected.keys() - given.keys()
    unexpected = given.keys() - expected.keys()
    mismatched = [f"{k} {tuple(given[k].shape)} != {tuple(expected[k])}"
                  for k in expected.keys() & given.keys() if given[k].shape != expected[k]]
    if missing or unexpected or mismatched:
        raise CheckpointError(
            f"{source} does not match the AudioVAE built from the config"
            + key_listing("missing keys", missing)
            + key_listing("unexpected keys", unexpected)
            + key_listing("shape mismatches (checkpoint != model)", mismatched)
        )


def to_module_state_dict(vae: AudioVAE, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Release naming -> our module's: fold weight norm, flatten ``alpha [1, C, 1] -> [C]``."""
    alphas = _snake_alpha_keys(vae)
    folded = fold_weight_norm(state_dict)
    return {k: (v.reshape(-1) if k in alphas else v) for k, v in folded.items()}


def release_state_dict(vae: AudioVAE) -> dict[str, torch.Tensor]:
    """Our module's weights in the release's ``audiovae.pth`` naming (the inverse of ``to_module_state_dict``):
    every conv as ``bias`` / ``weight_g`` ``[d0, 1, 1]`` / ``weight_v`` (``v`` = the folded weight, ``g`` = its norm
    over all dims but 0), Snake ``alpha`` as ``[1, C, 1]``. Loading it back gives the same weights up to rounding.
    """
    alphas = _snake_alpha_keys(vae)
    convs = set(weight_norm_module_names(vae))
    out: dict[str, torch.Tensor] = {}
    for key, value in vae.state_dict().items():
        prefix, _, leaf = key.rpartition(".")
        if prefix in convs and leaf == "weight":
            out[prefix + LEGACY_G] = value.reshape(value.shape[0], -1).norm(2, dim=1).reshape(-1, *[1] * (value.dim() - 1))
            out[prefix + LEGACY_V] = value.clone()
        elif key in alphas:
            out[key] = value.reshape(1, -1, 1).clone()
        else:
            out[key] = value.clone()
    return out


def load_audio_vae_state_dict(vae: AudioVAE, state_dict: Mapping[str, torch.Tensor], source: str) -> None:
    """Strictly load a release-format state dict into ``vae`` (fp32 weights; works on a ``meta`` model).

    The ``decoder.sr_bin_boundaries`` buffer is taken from the file even where its values differ from the config's
    (only their count is checked, as a shape): the reference's ``load_state_dict`` does the same, so the file's
    boundaries are the ones a reference-made checkpoint really uses.

    Raises:
        CheckpointError: key/shape mismatch.
    """
    check_checkpoint_keys(vae, state_dict, source)
    boundaries = state_dict.get("decoder.sr_bin_boundaries")
    if boundaries is not None and boundaries.tolist() != list(vae.cfg.sr_bin_boundaries or ()):
        log.warning("%s: decoder.sr_bin_boundaries %s differ from the config's %s; using the file's (as the reference)",
                    source, boundaries.tolist(), list(vae.cfg.sr_bin_boundaries or ()))
    module_sd = to_module_state_dict(vae, state_dict)
    # Floating tensors follow the model's dtype (a release could store bf16); the int32 buffer stays as is.
    dtype = next(vae.parameters()).dtype
    module_sd = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in module_sd.items()}
    load_into(vae, module_sd, source)


def read_audio_vae_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Read ``audiovae.safetensors`` or ``audiovae.pth`` (``{"state_dict": ...}``, ``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"AudioVAE weight file not found: {path}")
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read {path} as safetensors (corrupt or truncated?): {exc}") from exc
    return read_torch_state_dict(path)


def find_audio_vae_weights(directory: str | Path) -> Path:
    """The AudioVAE weight file of a model directory (``audiovae.safetensors`` first, then ``audiovae.pth``)."""
    d = Path(directory)
    for name in WEIGHT_FILES:
        if (d / name).is_file():
            return d / name
    raise CheckpointError(f"{d} has no AudioVAE weights: expected {' or '.join(WEIGHT_FILES)}")


def load_audio_vae(directory: str | Path, config: AudioVAEConfig | None = None,
                   device: str | torch.device = "cpu") -> AudioVAE:
    """Build the AudioVAE of a VoxCPM 2 model directory and load its weights (fp32, eval mode).

    Args:
        directory: folder with ``config.json`` (its ``audio_vae_config``; release values when absent) and the
            weight file.
        config: use this instead of reading ``config.json``.
        device: where the model lives.
    """
    d = Path(directory).expanduser()
    if not d.is_dir():
        raise CheckpointError(f"model directory not found: {d}")
    if config is None:
        if not (d / CONFIG_FILE).is_file():
            raise CheckpointError(f"{d} has no {CONFIG_FILE}")
        config = AudioVAEConfig.from_json(d / CONFIG_FILE)
    path = find_audio_vae_weights(d)
    state_dict = read_audio_vae_weights(path)
    with torch.device("meta"):
        vae = AudioVAE(config)
    load_audio_vae_state_dict(vae, state_dict, str(path))
    return vae.to(device).eval()
