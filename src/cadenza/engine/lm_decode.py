"""The LM worker's batched decode step: the next-token log-probabilities of B requests, in as few kernel launches as
their caches allow.

* Per-request caches (``KVCache``, the CPU default): one forward whose attention runs row by row (``layers/
  attention.py``); on a CPU that costs nothing extra.
* Pooled caches (``layers/kv_pool.py``, the default on CUDA): one forward with one batched attention per layer over
  the first ``span`` positions of every row, ``span`` rounded up to ``SPAN_STEP`` so that few shapes occur.
* On CUDA that pooled step is captured once per (batch bucket, span) as a CUDA graph and replayed: a decode step of
  a 0.5B LM is ~700 small kernels, whose launch cost is most of the step in eager mode (docs/performance.md, "GPU").
  Rows of a bucket beyond B write and read the pool's scratch slot.

Log-probabilities come back on the CPU (the samplers' generators are CPU ones, and the ids are needed there).
"""

from __future__ import annotations

import logging

import torch

from cadenza.layers.kv_pool import KVPool, PooledKVCache, PooledStep

log = logging.getLogger(__name__)

SPAN_STEP = 256  # attended positions are rounded up to a multiple of this (graph shapes)


class _Graph:
    """One captured pooled step: static inputs (embeddings, slots, positions) and output (log-probabilities)."""

    def __init__(self, lm, pool: KVPool, batch: int, span: int, hidden: int, dtype: torch.dtype,
                 mempool) -> None:
        device = pool.device
        self.embeds = torch.zeros(batch, 1, hidden, dtype=dtype, device=device)
        self.slots = torch.full((batch,), pool.scratch, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, dtype=torch.long, device=device)
        self.scratch = pool.scratch

        def step() -> torch.Tensor:
            cache = PooledStep(pool, self.slots, self.positions, span)
            return lm.log_probs(lm.forward_hidden(self.embeds, cache=cache)[:, -1])

        # Warm-up on a side stream (library handles, autotuning) with every row on the scratch slot, then capture.
        # thread_local: the vocoder workers keep launching their own work while this thread captures.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=mempool, capture_error_mode="thread_local"):
            self.out = step()

    def run(self, embeds: torch.Tensor, slots: list[int], positions: list[int]) -> torch.Tensor:
        n = embeds.shape[0]
        pad = self.embeds.shape[0] - n
        self.embeds[:n].copy_(embeds)
        self.slots.copy_(torch.tensor(slots + [self.scratch] * pad, dtype=torch.long))
        self.positions.copy_(torch.tensor(positions + [0] * pad, dtype=torch.long))
        self.graph.replay()
        return self.out[:n].cpu()


class DecodeStep:
    """``step(embeds [B, 1, H], caches) -> log-probabilities [B, V]`` (CPU) for the scheduler's LM worker."""

    def __init__(self, lm, pool: KVPool | None = None, cuda_graphs: bool = False) -> None:
        if cuda_graphs and (pool is None or pool.device.type != "cuda"):
            raise ValueError("CUDA graphs of the decode step need a KV pool on a CUDA device")
        self.lm, self.pool, self.cuda_graphs = lm, pool, cuda_graphs
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._mempool = torch.cuda.graph_pool_handle() if cuda_graphs else None
        buckets, b = [], 1
        while pool is not None and b < pool.slots:
            buckets.append(b)
            b *= 2
        self.buckets = [*buckets, pool.slots] if pool is not None else []

    def new_cache(self) -> PooledKVCache | None:
        """A pooled cache for a new request, or None without a pool (the decoder then sizes a ``KVCache`` of its
        own for its prompt)."""
        return self.pool.new_cache() if self.pool is not None else None

    @torch.inference_mode()
    def __call__(self, embeds: torch.Tensor, caches: list) -> torch.Tensor:
        pooled, others = [], []
        for i, cache in enumerate(caches):
            if isinstance(cache, PooledKVCache) and cache.pooled and cache.pool is self.pool:
                if cache.fits(1):
                    pooled.append(i)
                    continue
                cache.spill()  # grew past the pool's positions: on with a cache of its own
            others.append(i)
        if not others:
            return self._pooled(embeds, caches)
        out: list[torch.Tensor | None] = [None] * len(caches)
        if pooled:
            for i, row in zip(pooled, self._pooled(embeds[pooled], [caches[i] for i in pooled])):
                out[i] = row
        rows = self.lm.next_log_probs(embeds[others], [caches[i] for i in others])
        for i, row in zip(others, rows):
            out[i] = row
        return torch.stack(out)

    def _pooled(self, embeds: torch.Tensor, caches: list[PooledKVCache]) -> torch.Tensor:
        lengths = [c.length for c in caches]
        span = min(-(-(max(lengths) + 1) // SPAN_STEP) * SPAN_STEP, self.pool.positions)
        slots = [c.slot for c in caches]
        if self.cuda_graphs:
            bucket = next(b for b in self.buckets if b >= len(caches))
            graph = self._graphs.get((bucket, span))
            if graph is None:
                graph = self._graphs[(bucket, span)] = _Graph(self.lm, self.pool, bucket, span, embeds.shape[2],
                                                              embeds.dtype, self._mempool)
                log.debug("captured the LM decode step for batch %d, span %d (%d graphs)", bucket, span,
                          len(self._graphs))
            logp = graph.run(embeds, slots, lengths)
        else:
            device = self.pool.device
            step = PooledStep(self.pool, torch.tensor(slots, device=device), torch.tensor(lengths, device=device), span)
            logp = self.lm.next_log_probs(embeds, step)
        for cache in caches:
            cache.advance()
        return logp
