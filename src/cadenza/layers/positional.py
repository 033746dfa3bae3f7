"""ESPnet relative positional encoding ("rel_pos_espnet", Transformer-XL appendix B).

The module scales its input by ``sqrt(d_model)`` and returns, next to it, the sinusoidal embeddings of the relative
positions ``+(T-1) .. -(T-1)`` (key to the left of the query = positive), which ``RelPositionMultiHeadedAttention``
turns into position scores with its ``rel_shift`` trick. Queries that follow cached keys (incremental inference)
take a wider ``window`` of rows: ``+(past+T-1) .. -(T-1)``.

The table is a plain attribute, not a buffer: state dicts stay parameters-only and a model built on the ``meta``
device needs nothing materialised. It is always computed on the CPU in float32 with ``max_len`` rows (like the
reference, so every sine is evaluated the same way) and then copied to the input's device and dtype.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def relative_position_table(num_positions: int, d_model: int) -> torch.Tensor:
    """``[1, 2N - 1, d_model]`` float32 on CPU (N = ``num_positions``); row ``N - 1 - r`` encodes relative position r.

    Entry for position r: ``[sin(r w_0), cos(r w_0), sin(r w_1), ...]``, ``w_k = exp(-2k ln(10000) / d_model)``.
    """
    with torch.inference_mode(False):  # the cached table must be usable later by autograd (training)
        position = torch.arange(0, num_positions, dtype=torch.float32, device="cpu").unsqueeze(1)
        div_term = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float32, device="cpu") * -(math.log(10000.0) / d_model)
        )
        pe_positive = torch.zeros(num_positions, d_model, device="cpu")
        pe_negative = torch.zeros(num_positions, d_model, device="cpu")
        pe_positive[:, 0::2] = torch.sin(position * div_term)
        pe_positive[:, 1::2] = torch.cos(position * div_term)
        pe_negative[:, 0::2] = torch.sin(-1 * position * div_term)
        pe_negative[:, 1::2] = torch.cos(-1 * position * div_term)
        # Positive positions in reverse order, then negative ones without the duplicate 0.
        return torch.cat([torch.flip(pe_positive, [0]), pe_negative[1:]], dim=0).unsqueeze(0)


class EspnetRelPositionalEncoding(nn.Module):
    """``x [B, T, d] -> (x * sqrt(d), pos_emb [1, 2T-1, d])``. No parameters, no buffers."""

    def __init__(self, d_model: int, max_len: int = 5000) -> None:
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.xscale = math.sqrt(d_model)
        self._master: torch.Tensor | None = None  # [1, 2N-1, d], CPU float32
        self._table: torch.Tensor | None = None  # the master copied to the last device/dtype used

    def _table_for(self, size: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        if self._master is None or self._master.size(1) < 2 * size - 1:
            num_positions = self.max_len if self._master is None else size
            self._master = relative_position_table(max(num_positions, size), self.d_model)
            self._table = None
        table = self._table
        if table is None or table.size(1) != self._master.size(1) or table.device != device or table.dtype != dtype:
            with torch.inference_mode(False):
                table = self._master.to(device=device, dtype=dtype)
            self._table = table
        return table

    def position_encoding(self, size: int, offset: int = 0, device=None, dtype=torch.float32) -> torch.Tensor:
        """``[1, 2 * (size + offset) - 1, d]``: relative positions ``+(size+offset-1) .. -(size+offset-1)``."""
        return self.window(size + offset - 1, size + offset - 1, device, dtype)

    def window(self, most_left: int, most_right: int, device=None, dtype=torch.float32) -> torch.Tensor:
        """``[1, most_left + most_right + 1, d]``: the rows of relative positions ``+most_left .. -most_right``.

        ``T`` queries that follow ``past`` cached keys need ``most_left = past + T - 1``, ``most_right = T - 1``.
        """
        table = self._table_for(max(most_left, most_right) + 1, torch.device(device or "cpu"), dtype)
        center = table.size(1) // 2  # the row of relative position 0
        return table[:, center - most_left : center + most_right + 1]

    def forward(self, x: torch.Tensor, offset: int = 0, past: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[B, T, d]`` -> scaled x ``[B, T, d]`` and pos_emb ``[1, past + 2T - 1, d]``: relative positions
        ``+(past+T-1) .. -(T-1)`` for queries that follow ``past`` cached keys (``offset`` widens both ends)."""
        size = x.size(1)
        pos_emb = self.window(past + size + offset - 1, size + offset - 1, x.device, x.dtype)
        return x * self.xscale, pos_emb

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}"
