"""A key/value pool for batched decoding on an accelerator: one preallocated buffer per layer, a slot per request.

``KVCache`` (``kv_cache.py``) gives each request buffers of its own; a batched decode step over B requests then has
to attend each row separately (their caches have different lengths and live in different tensors), B small kernel
launches per layer. That is cheap on a CPU and ruinous on a GPU, where a launch costs more than the work (64 rows:
376 ms a step at release size on an H200, docs/performance.md "GPU"). Here every request's keys and values live in
one buffer per layer, ``[slots + 1, kv_heads, positions, head_dim]``: a decode step writes the B new keys with one
indexed store, gathers the B rows' first ``span`` positions with one indexed load and runs one masked attention.
The shapes of that step depend only on (B, span), so it can be captured as a CUDA graph (``engine/lm_decode.py``).

The last slot is scratch: padding rows of a graph bucket write and read there.
"""

from __future__ import annotations

import threading

import torch

from cadenza.layers.kv_cache import KVCache


class KVPool:
    """Keys/values of ``slots`` requests, ``positions`` each, for ``num_layers`` layers (plus one scratch slot)."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, slots: int, positions: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        if min(num_layers, kv_heads, head_dim, slots, positions) <= 0:
            raise ValueError("KVPool sizes must be positive")
        self.num_layers, self.slots, self.positions = num_layers, slots, positions
        shape = (slots + 1, kv_heads, positions, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._free = list(range(slots - 1, -1, -1))
        self._lock = threading.Lock()

    @property
    def scratch(self) -> int:
        return self.slots

    @property
    def device(self) -> torch.device:
        return self.keys[0].device

    @property
    def free_slots(self) -> int:
        with self._lock:
            return len(self._free)

    def acquire(self) -> int | None:
        """A free slot, or None when all are taken."""
        with self._lock:
            return self._free.pop() if self._free else None

    def release(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)

    def new_cache(self) -> PooledKVCache:
        return PooledKVCache(self)


class PooledKVCache:
    """One request's cache in a ``KVPool`` (the ``KVCache`` interface the model uses).

    The slot is taken at the first append (a queued request holds none) and given back by ``free``. A request that
    finds no free slot, or would outgrow the pool's positions, moves to a ``KVCache`` of its own ("spilled") and
    goes on there: slower on a GPU, never an error.
    """

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.num_layers = pool.num_layers
        self.slot: int | None = None
        self._lengths = [0] * pool.num_layers
        self.spilled: KVCache | None = None

    @property
    def pooled(self) -> bool:
        """Its keys are in the pool (a slot is held and the cache has not spilled)."""
        return self.spilled is None and self.slot is not None

    @property
    def length(self) -> int:
        return self.spilled.length if self.spilled is not None else self._lengths[0]

    def layer_length(self, layer: int) -> int:
        return self.spilled.layer_length(layer) if self.spilled is not None else self._lengths[layer]

    @property
    def nbytes(self) -> int:
        """Bytes this request holds: its own buffers once spilled; a pool slot counts once, in the pool."""
        return self.spilled.nbytes if self.spilled is not None else 0

    def fits(self, n: int) -> bool:
        """``n`` more positions fit in its pool slot."""
        return self.spilled is None and self._lengths[0] + n <= self.pool.positions

    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``KVCache.append`` (batch 1): store ``[1, kv_heads, n, head_dim]`` after the cached positions."""
        if self.spilled is None and self.slot is None and layer == 0:
            self.slot = self.pool.acquire()
            if self.slot is None:
                self.spill()
        if self.spilled is None and layer == 0 and not self.fits(keys.shape[2]):
            self.spill()
        if self.spilled is not None:
            return self.spilled.append(layer, keys, values)
        past, n = self._lengths[layer], keys.shape[2]
        kbuf, vbuf = self.pool.keys[layer], self.pool.values[layer]
        kbuf[self.slot, :, past : past + n] = keys[0]
        vbuf[self.slot, :, past : past + n] = values[0]
        self._lengths[layer] = past + n
        return kbuf[self.slot : self.slot + 1, :, : past + n], vbuf[self.slot : self.slot + 1, :, : past + n]

    def advance(self) -> None:
        """Count one position appended to every layer by a batched pooled step (``PooledStep``)."""
        self._lengths = [n + 1 for n in self._lengths]

    def spill(self) -> None:
        """Move the cached positions to a ``KVCache`` of its own and give the slot back."""
        if self.spilled is not None:
            return
        own = KVCache(self.num_layers, capacity=2 * max(self._lengths[0], 1))
        if self.slot is not None:
            for layer in range(self.num_layers):
                n = self._lengths[layer]
                if n:
                    own.append(layer, self.pool.keys[layer][self.slot : self.slot + 1, :, :n].clone(),
                               self.pool.values[layer][self.slot : self.slot + 1, :, :n].clone())
            self.pool.release(self.slot)
            self.slot = None
        self.spilled = own

    def crop(self, length: int) -> None:
        if length < 0:
            raise ValueError("crop length must be >= 0")
        if self.spilled is not None:
            self.spilled.crop(length)
        self._lengths = [min(length, n) for n in self._lengths]

    def free(self) -> None:
        if self.slot is not None:
            self.pool.release(self.slot)
            self.slot = None
        if self.spilled is not None:
            self.spilled.free()
        self.spilled = None
        self._lengths = [0] * self.num_layers

    def __del__(self) -> None:  # a request dropped without close() must not keep its slot
        try:
            if self.slot is not None:
                self.pool.release(self.slot)
                self.slot = None
        except Exception:
            pass

    def __repr__(self) -> str:
        where = "spilled" if self.spilled is not None else f"slot {self.slot}"
        return f"PooledKVCache({where}, length={self.length})"


class PooledStep:
    """One batched decode step of B pooled requests: where the new keys go and what each row attends.

    ``slots`` / ``positions`` ``[B]`` (long, on the pool's device): row i writes position ``positions[i]`` of slot
    ``slots[i]`` and attends that slot's positions ``0 .. positions[i]`` among the first ``span``.
    """

    def __init__(self, pool: KVPool, slots: torch.Tensor, positions: torch.Tensor, span: int) -> None:
        self.pool, self.slots, self.positions, self.span = pool, slots, positions, span
        keys = torch.arange(span, device=positions.device)
        self.mask = (keys[None, :] <= positions[:, None])[:, None, None, :]  # [B, 1, 1, span]

    def attend_inputs(self, layer: int, keys: torch.Tensor,
                      values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store the step's ``keys`` / ``values`` ``[B, kv_heads, 1, head_dim]``; return every row's keys and values
        ``[B, kv_heads, span, head_dim]`` and the mask ``[B, 1, 1, span]`` (True = attend)."""
        kbuf, vbuf = self.pool.keys[layer], self.pool.values[layer]
        kbuf[self.slots, :, self.positions] = keys[:, :, 0].to(kbuf.dtype)
        vbuf[self.slots, :, self.positions] = values[:, :, 0].to(vbuf.dtype)
        return kbuf[self.slots, :, : self.span], vbuf[self.slots, :, : self.span], self.mask
