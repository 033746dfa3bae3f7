"""Deepen a trained model: new residual blocks that start as the identity (function-preserving growth).

A warm start from a shallower checkpoint (``flow.init_grown``, docs/training.md) loads every tensor it has and
leaves the new blocks' ones fresh; this module then zeroes what each new block adds to its residual stream, so the
deeper model computes exactly what the checkpoint did and training starts from there instead of from a perturbed
copy (the "zero-init the last layer of each residual branch" practice of ResNets and transformers). Gradients
still reach every new tensor: the zeroed layers' own gradients are not zero, and the rest follow once they move.

What "adds to the residual stream" means per block kind (the flow estimator's, ``flow_estimator_blocks.py``):

* ``CausalResnetBlock1D`` (``block2(block1(x) + t) + res_conv(x)``): ``block2``'s LayerNorm scale and shift zeroed
  (Mish(0) = 0, so the branch gives 0) and ``res_conv`` the identity (it needs as many channels out as in);
* ``BasicTransformerBlock`` (``x + attn(x)``, ``x + ff(x)``): the attention's and the feed-forward's output
  projections zeroed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cadenza.errors import CheckpointError
from cadenza.models.cosyvoice2.flow_estimator_blocks import BasicTransformerBlock, CausalResnetBlock1D


@torch.no_grad()
def _resnet_identity(block: CausalResnetBlock1D) -> None:
    norm = block.block2.block[2]
    norm.weight.zero_()
    norm.bias.zero_()
    conv = block.res_conv
    if conv.in_channels != conv.out_channels:
        raise CheckpointError(f"a resnet block of {conv.in_channels} -> {conv.out_channels} channels cannot start as "
                              "the identity")
    conv.weight.copy_(torch.eye(conv.out_channels, dtype=conv.weight.dtype).unsqueeze(-1))
    conv.bias.zero_()


@torch.no_grad()
def _transformer_identity(block: BasicTransformerBlock) -> None:
    for linear in (block.attn1.to_out[0], block.ff.net[2]):
        linear.weight.zero_()
        linear.bias.zero_()


def start_as_identity(model: nn.Module, prefixes: Sequence[str]) -> int:
    """Make every residual block under each key prefix (e.g. ``decoder.estimator.mid_blocks.2.``) the identity.

    Returns how many blocks were set. A prefix that names no submodule, or one holding no block this module knows,
    is an error (a typo would otherwise train a fresh block in the middle of a trained model).
    """
    modules = dict(model.named_modules())
    count = 0
    for prefix in prefixes:
        name = prefix.rstrip(".")
        if name not in modules:
            raise CheckpointError(f"init_grown: {prefix!r} names no submodule of the model")
        found = 0
        for sub in modules[name].modules():
            if isinstance(sub, CausalResnetBlock1D):
                _resnet_identity(sub)
                found += 1
            elif isinstance(sub, BasicTransformerBlock):
                _transformer_identity(sub)
                found += 1
        if not found:
            raise CheckpointError(f"init_grown: {prefix!r} holds no residual block that can start as the identity")
        count += found
    return count
