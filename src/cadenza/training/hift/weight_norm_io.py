"""Weight norm for HiFT training and the export of a trained generator under the release's ``hift.pt`` key names.

Training can run the generator with ``torch.nn.utils.parametrizations.weight_norm`` on the same convs the reference
wraps (:meth:`HiFTGenerator.weight_norm_module_names`); its state dict then already uses the release's names
(``X.parametrizations.weight.original0`` = g, ``original1`` = v). A generator trained with plain convs is exported by
*unfolding* each weight into ``g = ||w||`` (norm over all dims but 0) and ``v = w``; ``fold_weight_norm`` at load
time maps both back to the trained weights to float rounding (~1e-9 absolute on the weights: torch's fused weight-norm
kernel and the fold sum the norm in different orders).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from cadenza.errors import CheckpointError
from cadenza.layers.weight_norm import PARAM_G, PARAM_V, weight_norm_key_shapes
from cadenza.models.cosyvoice2.hift import HiFTGenerator


def apply_weight_norm(generator: HiFTGenerator) -> HiFTGenerator:
    """Parametrise every conv the reference weight-normalises (in place; the effective weights are unchanged)."""
    for name in generator.weight_norm_module_names():
        module = generator.get_submodule(name)
        if not parametrize.is_parametrized(module, "weight"):
            weight_norm(module)
    return generator


def has_weight_norm(generator: nn.Module) -> bool:
    return any(parametrize.is_parametrized(m, "weight") for m in generator.modules())


def _plain_shapes(generator: HiFTGenerator) -> dict[str, torch.Size]:
    """``key -> shape`` of the generator as a plain (folded) module, in ``state_dict`` order."""
    shapes: dict[str, torch.Size] = {}
    for key, value in generator.state_dict().items():
        if key.endswith(PARAM_G):
            continue
        if key.endswith(PARAM_V):
            key = key[: -len(PARAM_V)] + ".weight"
        shapes[key] = value.shape
    return shapes


def release_state_dict(generator: HiFTGenerator) -> dict[str, torch.Tensor]:
    """The generator's weights under the release's key names and order (parametrization weight-norm names).

    Works for a weight-normalised or a plain generator, and for convs with further parametrizations (their effective
    weights); tensors are detached float32 CPU copies.

    Raises:
        CheckpointError: the key set differs from what the release layout expects (a bug, never user input).
    """
    names = generator.weight_norm_module_names()
    expected = weight_norm_key_shapes(_plain_shapes(generator), names)
    state = {k: v.detach().to("cpu", torch.float32) for k, v in generator.state_dict().items()}
    for name in names:
        module = generator.get_submodule(name)
        if parametrize.is_parametrized(module, "weight") and len(module.parametrizations.weight) > 1:
            # More than weight norm on it (a training-time constraint such as upsampler_phases.EqualPhaseGain):
            # its originals are not what the module computes with, so export the effective weight, unfolded below.
            del state[name + PARAM_G], state[name + PARAM_V]
            state[f"{name}.weight"] = module.weight.detach().to("cpu", torch.float32)
        if f"{name}.weight" in state:  # a plain conv: unfold
            w = state.pop(f"{name}.weight")
            g = w.reshape(w.shape[0], -1).norm(2, dim=1).reshape([w.shape[0]] + [1] * (w.dim() - 1))
            state[name + PARAM_G] = g
            state[name + PARAM_V] = w
    if set(state) != set(expected) or any(state[k].shape != s for k, s in expected.items()):
        raise CheckpointError("HiFT export does not match the release layout: "
                              f"{sorted(set(state) ^ set(expected))[:5]}")
    return {k: state[k].clone().contiguous() for k in expected}
