"""The request scheduler's limits and worker layout (``SchedulerConfig``); no torch import, so the CLI can show
its defaults without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

FIRST_AUDIO_PAUSES = ("always", "contended")


@dataclass(frozen=True)
class SchedulerConfig:
    max_active: int = 8  # requests decoded together
    max_queued: int = 32  # requests waiting for a slot; more -> EngineBusyError
    max_buffered_chunks: int = 16  # per request, audio chunks not yet read by the consumer
    # A request whose flow chunk is ready waits up to this many LM steps for requests a few tokens short of a chunk
    # of the same size, so their flows run as one batch (cheaper than one after the other); 0 = never wait.
    flow_batch_wait_steps: int = 4
    # Vocoder workers (flow + HiFT) running at the same time beside the LM worker, each owning the requests it was
    # given at admission (the least loaded one's), and the torch intra-op threads of each worker. None = chosen
    # from the cores torch uses when the first request arrives (``worker_layout``); docs/performance.md measures it.
    vocoder_workers: int | None = None
    lm_threads: int | None = None
    vocoder_threads: int | None = None
    # While a request's first chunk is being made the LM worker steps only requests still short of their own first
    # chunk. "always": whenever that happens (the lowest time to first audio). "contended": only while an LM step
    # would take a core from the busy vocoder workers, so a lone stream keeps decoding on the spare core: its later
    # chunks come sooner and playback stalls less, for a slower first chunk (memory contention; docs/performance.md
    # measures both).
    first_audio_pause: str = "always"
    # A vocoder worker with no chunk ready computes the flow of a stream's next chunk ahead, up to the chunk's split
    # point once its look-ahead has arrived (``StreamSynthesis.split_point``: the chunk is cut there either way, so
    # the audio is the same bit for bit), so that chunk is quicker once its last token comes. Not while a request
    # awaits its first audio.
    flow_ahead: bool = True
    # CosyVoice 2: streams of one vocoder worker whose next flow / HiFT calls have as many frames run as one batch (HiFT
    # ~14 % cheaper at two streams in bfloat16 on a CPU). A batched call rounds differently from a lone one,
    # so a stream's audio then depends on what it met: by ~1e-5 in float32, by bfloat16's own step (about -35 dB)
    # where the flow and HiFT run in bfloat16 (``dtype="auto"`` on a CPU with AMX / AVX-512 BF16, the CLI's
    # default). False: every call alone, so a seed gives the same audio bit for bit whatever else runs. (VoxCPM 2
    # always steps its requests together: float rounding only, ~1e-7 relative, engine/voxcpm2_scheduler.py.)
    batch_streams: bool = True
    # Batched LM decoding on an accelerator (docs/performance.md, "GPU"): every active request's keys and values in
    # one preallocated pool (``layers/kv_pool.py``), so a decode step of B requests is one batched attention instead
    # of B, and on CUDA that step is replayed from CUDA graphs (``engine/lm_decode.py``). None = on when the model is
    # on a CUDA device; a CPU keeps per-request caches (there the per-row attention costs nothing extra).
    lm_kv_pool: bool | None = None
    lm_cuda_graphs: bool | None = None
    lm_pool_positions: int = 4096  # per request; one that grows past it moves to a cache of its own (slower, no error)
    # MiB that the streamed flow's caches of all active requests may hold together (each is bounded on its own by
    # ``StreamSchedule.flow_cache_limit_mb``): past it, the largest are freed and their requests go on recomputing
    # the prefix per chunk (the same audio, slower). "auto": half of the memory free on the model's device when the
    # workers start (``engine/memory_budget.py``); None: no bound across requests.
    flow_cache_budget_mb: float | str | None = "auto"
    # Once no engine of the process holds a request (and none has come for half a second), give the C heap's free
    # memory back to the OS (glibc ``malloc_trim``; ``engine/idle_memory.py``): a long stream otherwise leaves the
    # process ~200 MB larger after it ends. False: this engine's requests never count as idle nor busy.
    release_idle_memory: bool = True

    def worker_layout(self, cores: int) -> tuple[int, int, int]:
        """(vocoder workers, LM threads, threads per vocoder worker) for ``cores`` intra-op threads. Unset values:
        two vocoder workers from two cores on, the cores shared between them, the LM worker half of them. On a 2-core
        CPU, two single-threaded vocoder workers beat one with both threads by ~35 % at 8 concurrent streams and
        cost a single stream nothing (intra-op threads gain little at one chunk's size)."""
        cores = max(1, cores)
        workers = self.vocoder_workers or (2 if cores >= 2 else 1)
        return (workers, self.lm_threads or max(1, cores // 2),
                self.vocoder_threads or max(1, cores // workers))

    def __post_init__(self) -> None:
        if self.max_active < 1 or self.max_queued < 0 or self.max_buffered_chunks < 1 or self.flow_batch_wait_steps < 0:
            raise ValueError("bad scheduler limits")
        if self.first_audio_pause not in FIRST_AUDIO_PAUSES:
            raise ValueError(f"first_audio_pause must be one of {', '.join(FIRST_AUDIO_PAUSES)}, "
                             f"not {self.first_audio_pause!r}")
        if self.lm_pool_positions < 64:
            raise ValueError(f"lm_pool_positions must be >= 64, got {self.lm_pool_positions}")
        budget = self.flow_cache_budget_mb
        if not (budget is None or budget == "auto" or (isinstance(budget, (int, float)) and not isinstance(budget, bool)
                                                       and budget >= 0)):
            raise ValueError(f"flow_cache_budget_mb must be 'auto', None or a number of MiB >= 0, not {budget!r}")
        for name in ("vocoder_workers", "lm_threads", "vocoder_threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {getattr(self, name)}")
