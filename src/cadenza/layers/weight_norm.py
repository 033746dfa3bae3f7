"""Weight-norm folding for checkpoints saved from weight-normalised modules.

Released vocoder checkpoints store each weight-normalised convolution as a magnitude ``g`` and a direction
``v`` instead of a plain ``weight``. Two namings exist:

* ``X.parametrizations.weight.original0`` (g) / ``X.parametrizations.weight.original1`` (v)
  (``torch.nn.utils.parametrizations.weight_norm``, torch >= 2.1);
* ``X.weight_g`` (g) / ``X.weight_v`` (v) (the legacy ``torch.nn.utils.weight_norm``).

Our modules are plain ``Conv1d`` / ``ConvTranspose1d``; the effective weight is computed once at load time:
``weight = v * (g / ||v||)`` with the norm over all dims except dim 0 (``weight_norm(dim=0)``, the default).
For ``ConvTranspose1d`` (weight ``[in, out, k]``) that is a per-*input*-channel norm; ``g`` is then ``[in, 1, 1]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from cadenza.errors import CheckpointError

PARAM_G = ".parametrizations.weight.original0"
PARAM_V = ".parametrizations.weight.original1"
LEGACY_G = ".weight_g"
LEGACY_V = ".weight_v"


def weight_from_g_v(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Effective weight of ``weight_norm(dim=0)``.

    Args:
        g: magnitude, ``[d0, 1, ..., 1]`` (same rank as ``v``).
        v: direction, ``[d0, ...]``.

    Returns:
        ``v * (g / ||v||)``, shape of ``v``. The expression order matches torch's ``_weight_norm`` so that the folded
        weight equals what the parametrised module computes (to rounding).
    """
    if g.dim() != v.dim() or g.shape[0] != v.shape[0] or g[0].numel() != 1:
        raise CheckpointError(f"weight-norm g {tuple(g.shape)} does not fit v {tuple(v.shape)}")
    norm = v.reshape(v.shape[0], -1).norm(2, dim=1).reshape(g.shape)
    return v * (g / norm)


def fold_weight_norm(state_dict: Mapping[str, object]) -> dict[str, object]:
    """Replace every weight-norm pair (either naming) by the plain ``X.weight``; other entries pass unchanged.

    Key order is kept: ``X.weight`` takes the place of the pair's first key.

    Raises:
        CheckpointError: a ``g`` without its ``v`` (or the reverse), or a pair whose shapes do not fit.
    """
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        split = _split_key(key)
        if split is not None:
            pairs.setdefault(split[0], {})[split[1]] = value
    for prefix, gv in pairs.items():
        if set(gv) != {"g", "v"}:
            raise CheckpointError(f"weight-norm entry {prefix!r} has only its {'g' if 'g' in gv else 'v'} tensor")
        if _weight_key(prefix) in state_dict:
            raise CheckpointError(f"{prefix!r} has both a plain weight and weight-norm tensors")

    out: dict[str, object] = {}
    for key, value in state_dict.items():
        split = _split_key(key)
        if split is None:
            out[key] = value
        elif _weight_key(split[0]) not in out:
            gv = pairs[split[0]]
            out[_weight_key(split[0])] = weight_from_g_v(gv["g"], gv["v"])
    return out


def _split_key(key: str) -> tuple[str, str] | None:
    """``'a.b.weight_g'`` -> ``('a.b', 'g')``; a top-level ``'weight_v'`` -> ``('', 'v')``; other keys -> None."""
    for suffix, kind in ((PARAM_G, "g"), (PARAM_V, "v"), (LEGACY_G, "g"), (LEGACY_V, "v")):
        if key.endswith(suffix):
            return key[: -len(suffix)], kind
        if key == suffix[1:]:
            return "", kind
    return None


def _weight_key(prefix: str) -> str:
    return _join(prefix, ".weight")


def _join(prefix: str, dotted_suffix: str) -> str:
    return prefix + dotted_suffix if prefix else dotted_suffix[1:]


def weight_norm_key_shapes(
    shapes: Mapping[str, torch.Size], wn_modules: Iterable[str], legacy: bool = False
) -> dict[str, torch.Size]:
    """Map a plain module's ``key -> shape`` to the key names a weight-normalised checkpoint uses.

    Args:
        shapes: e.g. ``{k: v.shape for k, v in model.state_dict().items()}`` of the plain (folded) module.
        wn_modules: names of the submodules that the reference wraps in ``weight_norm``.
        legacy: emit ``weight_g`` / ``weight_v`` instead of the parametrization names.

    Returns:
        ``key -> shape`` in the reference's order: for a weight-normalised module its other direct parameters (bias)
        come first, then g (``[d0, 1, ..]``) and v (the weight's shape), as ``nn.Module.state_dict`` lists them.
    """
    wn = set(wn_modules)
    g_suffix, v_suffix = (LEGACY_G, LEGACY_V) if legacy else (PARAM_G, PARAM_V)
    missing = sorted(m for m in wn if _weight_key(m) not in shapes)
    if missing:
        raise KeyError(f"weight-norm modules without a weight: {missing}")
    out: dict[str, torch.Size] = {}
    held: tuple[str, torch.Size] | None = None  # a weight waiting until its module's direct keys are emitted

    def flush() -> None:
        nonlocal held
        if held is not None:
            module, shape = held
            out[_join(module, g_suffix)] = torch.Size([shape[0]] + [1] * (len(shape) - 1))
            out[_join(module, v_suffix)] = shape
            held = None

    for key, shape in shapes.items():
        module, _, name = key.rpartition(".")
        if held is not None and module != held[0]:
            flush()
        if name == "weight" and module in wn:
            held = (module, shape)
        else:
            out[key] = shape
    flush()
    return out
