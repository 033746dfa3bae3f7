"""A linear layer with int8 weights for CPUs that compute bfloat16 in hardware (AMX / AVX-512 BF16).

A batch-1 LM decode step reads every weight once, so it runs at the speed weights come out of memory: int8 weights
are a quarter of float32's bytes. ``torch._weight_int8pack_mm`` multiplies bfloat16 activations by int8 weights with
a per-output-channel scale, and is fast for a few rows (the decode step of one or a few streams) but slower than a
plain bfloat16 product for many (prefill, large batches; measured on Sapphire Rapids, one thread, 896 x 4864: one
row 240 us against float32's 620, sixteen rows 1,760 us against bfloat16's 640). So the layer keeps the weights a
second time in bfloat16 for calls with more than ``SMALL_ROWS`` rows: 3 bytes per weight instead of float32's 4.

Only the weights are quantized: activations go in as bfloat16, not int8, so the error is that of the weight rounding
(relative output error ~0.5 %, against ~1.7 % for dynamic int8 quantization of the same layer;
docs/performance.md, "CPU fast path").
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL_ROWS = 4  # rows up to which the int8 product is used (above, bfloat16 weights)


def int8_weights_supported() -> bool:
    """This torch has the int8-weight product on the CPU."""
    return hasattr(torch, "_weight_int8pack_mm") and hasattr(torch.ops.aten, "_weight_int8pack_mm")


class Int8WeightLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` stored as int8 per output channel (symmetric, scale = max |row| / 127).

    Input ``[..., in_features]`` float32 -> ``[..., out_features]`` float32. Built from a float32 ``nn.Linear`` by
    ``from_linear``; inference only (no gradients).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight_int8", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(out_features, dtype=torch.bfloat16))
        self.register_buffer("weight_bf16", torch.zeros(out_features, in_features, dtype=torch.bfloat16))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear) -> Int8WeightLinear:
        weight = linear.weight.detach().float()
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None)
        exact = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        # The product takes its scales in bfloat16: round each up to the next bfloat16 at or above it, and quantize
        # by that rounded scale, so the stored pair is the weight to half a step (no row gain error, no clipping).
        scale = exact.to(torch.bfloat16)
        low = scale.float() < exact
        scale[low] = torch.nextafter(scale[low], torch.full_like(scale[low], float("inf")))
        layer.weight_int8.copy_(torch.round(weight / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8))
        layer.scale.copy_(scale)
        layer.weight_bf16.copy_(weight.to(torch.bfloat16))
        if linear.bias is not None:
            layer.bias.copy_(linear.bias.detach().float())
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if rows.shape[0] <= SMALL_ROWS:
            out = torch._weight_int8pack_mm(rows.contiguous(), self.weight_int8, self.scale).float()
        else:
            out = F.linear(rows, self.weight_bf16).float()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def int8_weight_linears(module: nn.Module) -> nn.Module:
    """Every ``nn.Linear`` under ``module`` replaced in place by an ``Int8WeightLinear``; returns ``module``."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8WeightLinear.from_linear(child))
        else:
            int8_weight_linears(child)
    return module
