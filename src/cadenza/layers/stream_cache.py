"""Per-stream state of causal and chunk-causal layers, for incremental (chunk by chunk) inference.

A ``StreamCache`` belongs to one request; the layers are shared and keep nothing per request, they look their
state up here by themselves as key. Each call covers input positions ``[start, start + T)`` of the stream, of
which the first ``commit`` are *final* (later input will never change them, e.g. complete attention chunks).
Layers keep only the state of final positions:

* causal convolutions keep the input frames just before ``start + commit`` (:meth:`left_context`);
* attention layers append keys/values of all ``T`` positions to attend over them, then keep only the first
  ``commit`` (:meth:`kv` + ``KVCache.crop``);

so the next call starts at ``start + commit`` and recomputes the non-final tail together with the new input.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from cadenza.layers.kv_cache import KVCache


class StreamCache:
    """State of the layers of one stream, keyed by layer (or ``(layer, tag)``)."""

    def __init__(self, store: dict | None = None, start: int = 0, commit: int = 0, reserve: int = 0) -> None:
        """reserve: positions each attention layer's key/value buffers get on first use (they grow by doubling
        beyond; a good estimate of the stream length avoids the copies and the up to 2x over-allocation)."""
        self._store: dict[Hashable, object] = {} if store is None else store
        self.start = start  # absolute position of the first input frame of the current call
        self.commit = commit  # leading input frames of the current call that are final
        self.reserve = reserve

    def at(self, start: int, commit: int) -> StreamCache:
        """Set the position of the next call; returns self."""
        if start < 0 or commit < 0:
            raise ValueError(f"start and commit must be >= 0, got {start}, {commit}")
        self.start, self.commit = start, commit
        return self

    def scaled(self, factor: int) -> StreamCache:
        """A view on the same state for layers that run at ``factor`` x the frame rate (after an upsampler)."""
        return StreamCache(self._store, self.start * factor, self.commit * factor, self.reserve * factor)

    def get(self, key: Hashable, default=None):
        return self._store.get(key, default)

    def set(self, key: Hashable, value) -> None:
        self._store[key] = value

    def left_context(self, layer: Hashable, x: torch.Tensor, frames: int, zero_fill: bool = True) -> torch.Tensor:
        """``[B, C, T]`` -> ``[history ‖ x]``: the ``frames`` input frames before ``start`` (zeros at the stream start
        when ``zero_fill``; otherwise only the frames that exist, ``min(frames, start)``). Stores the ``frames`` input
        frames before ``start + commit`` for the next call."""
        if self.commit > x.size(-1):
            raise ValueError(f"commit {self.commit} exceeds the {x.size(-1)} input frames")
        past = self._store.get(layer)
        if past is None:
            past = x.new_zeros(x.size(0), x.size(1), frames if zero_fill else 0)
        full = torch.cat([past, x], dim=-1)
        end = past.size(-1) + self.commit
        self._store[layer] = full[..., max(0, end - frames) : end].clone()  # clone: don't pin the whole input
        return full

    def kv(self, layer: Hashable) -> KVCache:
        """The key/value cache of an attention layer (created empty on first use)."""
        cache = self._store.get(layer)
        if cache is None:
            cache = KVCache(num_layers=1, capacity=self.reserve)
            self._store[layer] = cache
        return cache

    def clone(self) -> StreamCache:
        """An independent copy of the stored state (tensors and key/value caches copied; the position kept)."""
        store: dict[Hashable, object] = {}
        for key, value in self._store.items():
            if isinstance(value, KVCache):
                store[key] = value.clone()
            elif isinstance(value, tuple):
                store[key] = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in value)
            else:
                store[key] = value.clone() if isinstance(value, torch.Tensor) else value
        return StreamCache(store, self.start, self.commit, self.reserve)

    def free(self) -> None:
        """Drop every stored tensor (the cache can then start a new stream)."""
        for value in self._store.values():
            if isinstance(value, KVCache):
                value.free()
        self._store.clear()
        self.start = self.commit = 0

    def __len__(self) -> int:
        return len(self._store)

    @property
    def nbytes(self) -> int:
        """Bytes held by the stored tensors."""
        total = 0
        for value in self._store.values():
            if isinstance(value, KVCache):
                total += value.nbytes
            else:
                tensors = value if isinstance(value, tuple) else (value,)
                total += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
        return total


class RowStreamCaches:
    """The ``StreamCache`` s of several streams for one batched call (``n`` streams, batch ``k * n`` rows).

    Row ``r`` belongs to stream ``r % n``: the batch is ``k`` blocks of ``n`` rows (e.g. classifier-free guidance's
    conditional block then unconditional block), and each stream's own cache holds its ``k`` rows in block order.
    The streams may be at different positions (``start``/``commit`` set on each cache); layers that support it
    split the rows per stream (:meth:`split`), continue each from its own state and stack the results (:meth:`merge`).
    """

    def __init__(self, caches: list[StreamCache]) -> None:
        if not caches:
            raise ValueError("RowStreamCaches needs at least one stream cache")
        self.caches = list(caches)

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``[k * n, ...]`` -> n tensors ``[k, ...]`` (stream i's rows ``i, i + n, ...``)."""
        n = len(self.caches)
        if x.size(0) % n:
            raise ValueError(f"batch of {x.size(0)} rows is not a multiple of {n} streams")
        return [x[i::n] for i in range(n)]

    def merge(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """Inverse of :meth:`split`: n tensors ``[k, ...]`` -> ``[k * n, ...]``."""
        stacked = torch.stack(parts, dim=1)  # [k, n, ...]
        return stacked.reshape(-1, *stacked.shape[2:])

    def left_context(self, layer: Hashable, x: torch.Tensor, frames: int, zero_fill: bool = True) -> torch.Tensor:
        """Per-stream :meth:`StreamCache.left_context`, stacked (needs ``zero_fill`` so every stream gets ``frames``)."""
        if not zero_fill:
            raise ValueError("batched left context needs zero_fill (equal history lengths)")
        n = len(self.caches)
        pasts = []
        for cache in self.caches:
            if cache.commit > x.size(-1):
                raise ValueError(f"commit {cache.commit} exceeds the {x.size(-1)} input frames")
            past = cache.get(layer)
            pasts.append(x.new_zeros(x.size(0) // n, x.size(1), frames) if past is None else past)
        full = torch.cat([self.merge(pasts), x], dim=-1)  # one copy of x for all streams (not one per stream)
        for i, cache in enumerate(self.caches):
            cache.set(layer, full[i::n, :, cache.commit : frames + cache.commit].clone())
        return full
