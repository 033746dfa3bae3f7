"""Per-request key/value cache for decoder self-attention.

One ``KVCache`` holds the keys and values of every attention layer for one batch of sequences that advance
together (batch 1 = one request; a scheduler keeps one object per request and can ``crop``/``free`` it
independently). Storage per layer is a pre-allocated buffer ``[B, kv_heads, capacity, head_dim]`` that grows by
doubling, so appending a decode step copies only the new token instead of re-concatenating the whole past
(which is what HF's ``DynamicCache`` does on every step).
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys/values of ``num_layers`` attention layers, each ``[B, kv_heads, T, head_dim]``.

    Buffers are allocated lazily on the first ``append`` with the dtype/device/shape of the incoming keys.
    ``length`` is the number of cached positions of layer 0; during a forward pass the layers are appended one
    after another, so read ``length`` before the pass (the model does) if you need the past length.
    """

    def __init__(self, num_layers: int, capacity: int = 0) -> None:
        """capacity: positions to reserve on first use (0 = exactly what the first append needs)."""
        if num_layers <= 0:
            raise ValueError("KVCache needs at least one layer")
        self.num_layers = num_layers
        self.initial_capacity = capacity
        self._keys: list[torch.Tensor | None] = [None] * num_layers
        self._values: list[torch.Tensor | None] = [None] * num_layers
        self._lengths = [0] * num_layers

    def clone(self) -> KVCache:
        """An independent copy holding the cached positions only (appends to either leave the other as it was)."""
        out = KVCache(self.num_layers, self.initial_capacity)
        for i in range(self.num_layers):
            n = self._lengths[i]
            if self._keys[i] is not None:
                out._keys[i] = self._keys[i][:, :, :n].clone()
                out._values[i] = self._values[i][:, :, :n].clone()
            out._lengths[i] = n
        return out

    @property
    def length(self) -> int:
        """Cached positions (of layer 0)."""
        return self._lengths[0]

    def layer_length(self, layer: int) -> int:
        return self._lengths[layer]

    @property
    def capacity(self) -> int:
        buf = self._keys[0]
        return 0 if buf is None else buf.shape[2]

    def keys(self, layer: int) -> torch.Tensor | None:
        """``[B, kv_heads, T, head_dim]`` view of the cached keys of ``layer`` (None before the first append)."""
        buf = self._keys[layer]
        return None if buf is None else buf[:, :, : self._lengths[layer]]

    def values(self, layer: int) -> torch.Tensor | None:
        buf = self._values[layer]
        return None if buf is None else buf[:, :, : self._lengths[layer]]

    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``keys``/``values`` ``[B, kv_heads, n, head_dim]`` after the cached ones of ``layer``.

        Returns views of all keys and values of that layer, ``[B, kv_heads, past + n, head_dim]``.
        """
        past, n = self._lengths[layer], keys.shape[2]
        kbuf, vbuf = self._keys[layer], self._values[layer]
        if kbuf is None or past + n > kbuf.shape[2]:
            kbuf, vbuf = self._grow(layer, keys, past + n)
        kbuf[:, :, past : past + n] = keys
        vbuf[:, :, past : past + n] = values
        self._lengths[layer] = past + n
        return kbuf[:, :, : past + n], vbuf[:, :, : past + n]

    def _grow(self, layer: int, like: torch.Tensor, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = self._keys[layer], self._values[layer]
        old_cap = 0 if old_k is None else old_k.shape[2]
        cap = max(needed, 2 * old_cap, self.initial_capacity)
        b, h, _, d = like.shape
        new_k = like.new_empty(b, h, cap, d)
        new_v = like.new_empty(b, h, cap, d)
        past = self._lengths[layer]
        if old_k is not None and past:
            new_k[:, :, :past] = old_k[:, :, :past]
            new_v[:, :, :past] = old_v[:, :, :past]
        self._keys[layer], self._values[layer] = new_k, new_v
        return new_k, new_v

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on (e.g. to roll back speculative tokens); keeps the buffers."""
        if length < 0:
            raise ValueError("crop length must be >= 0")
        self._lengths = [min(length, n) for n in self._lengths]

    def free(self) -> None:
        """Release the buffers; the cache becomes empty and can be reused."""
        self._keys = [None] * self.num_layers
        self._values = [None] * self.num_layers
        self._lengths = [0] * self.num_layers

    @property
    def nbytes(self) -> int:
        """Bytes currently allocated (capacity, not just the used length)."""
        return sum(t.numel() * t.element_size() for t in (*self._keys, *self._values) if t is not None)

    def __repr__(self) -> str:
        return f"KVCache(layers={self.num_layers}, length={self.length}, capacity={self.capacity})"
