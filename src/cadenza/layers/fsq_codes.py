"""Integer FSQ codes <-> single token ids in the ``(2K + 1)``-ary number system.

A finite scalar quantiser with bound ``K`` gives ``D`` integers in ``[-K, K]`` per frame (see ``fsq.py``). The
supervised speech tokenizer of CosyVoice 2 turns them into one id ``sum_j (c_j + K) * (2K + 1)^j``, so the codebook
has ``(2K + 1)^D`` entries (K = 1, D = 8: 6561). Digit ``j = 0`` is the least significant one.
"""

from __future__ import annotations

import torch


def fsq_codebook_size(scale: int, dims: int) -> int:
    """Number of distinct ids of ``dims`` codes bounded by ``scale`` (``(2 * scale + 1) ** dims``)."""
    if scale <= 0 or dims <= 0:
        raise ValueError(f"FSQ scale and dims must be positive, got scale={scale}, dims={dims}")
    return (2 * scale + 1) ** dims


def _radix_powers(scale: int, dims: int, device: torch.device) -> torch.Tensor:
    return (2 * scale + 1) ** torch.arange(dims, dtype=torch.int64, device=device)


def codes_to_index(codes: torch.Tensor, scale: int) -> torch.Tensor:
    """``codes [..., D]`` (integer-valued, in ``[-scale, scale]``, any dtype) -> ids ``[...]`` int64.

    Raises:
        ValueError: a code outside ``[-scale, scale]`` (a bug upstream: the quantiser bounds its output).
    """
    digits = torch.round(codes).to(torch.int64) + scale
    if digits.numel() and (int(digits.min()) < 0 or int(digits.max()) > 2 * scale):
        raise ValueError(f"FSQ codes must lie in [-{scale}, {scale}], got [{int(digits.min()) - scale}, "
                         f"{int(digits.max()) - scale}]")
    return (digits * _radix_powers(scale, codes.shape[-1], codes.device)).sum(-1)


def index_to_codes(index: torch.Tensor, scale: int, dims: int) -> torch.Tensor:
    """ids ``[...]`` (int, in ``[0, (2 * scale + 1) ** dims)``) -> codes ``[..., dims]`` int64 in ``[-scale, scale]``."""
    size = fsq_codebook_size(scale, dims)
    index = index.to(torch.int64)
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
        raise ValueError(f"FSQ ids must lie in [0, {size}), got [{int(index.min())}, {int(index.max())}]")
    digits = (index.unsqueeze(-1) // _radix_powers(scale, dims, index.device)) % (2 * scale + 1)
    return digits - scale
