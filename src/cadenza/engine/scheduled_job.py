"""What the scheduler keeps per request (``Job``) and its limits (``SchedulerConfig``)."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from cadenza.engine.request import SynthesisRequest
from cadenza.engine.token2wav import StreamSynthesis
from cadenza.models.cosyvoice2.lm_decoding import BistreamDecoder, UnistreamDecoder


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
        for name in ("vocoder_workers", "lm_threads", "vocoder_threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {getattr(self, name)}")


@dataclass(eq=False)
class Job:
    """One request's live state inside the scheduler. ``decoder`` belongs to the LM worker, ``synth`` to the vocoder
    worker: each is touched (and freed) by its own worker only. Flags and buffers change under the scheduler lock."""

    request: SynthesisRequest
    stream: bool
    decoder: UnistreamDecoder | BistreamDecoder | None
    synth: StreamSynthesis | None = None
    ids: list[int] = field(default_factory=list)  # appended by the LM worker only; read by the vocoder worker
    lm_done: bool = False  # set after the last token is in ``ids``
    done: bool = False  # the final item is in ``buffer``; the workers free their halves
    cancelled: bool = False
    vocoder_released: bool = False  # the vocoder worker freed (or never had) ``synth``
    vocoder_worker: int = 0  # index of the vocoder worker that owns ``synth`` (set at admission)
    chunks_out: int = 0
    text_inbox: collections.deque = field(default_factory=collections.deque)  # bistream text ids / _DONE
    buffer: collections.deque = field(default_factory=collections.deque)  # audio chunks / exception / _DONE
    seq: int = 0
    first_chunk_tokens: int = 0  # tokens its first streaming chunk needs (hop + look-ahead)
    ready_since: int | None = None  # LM step count when its ready flow chunk started waiting for batch partners
    submitted: float = field(default_factory=time.perf_counter)
    first_chunk_s: float | None = None

    @property
    def released(self) -> bool:
        return self.decoder is None and self.vocoder_released

    def release_lm(self) -> None:
        if self.decoder is not None:
            self.decoder.close()
            self.decoder = None

    def release_vocoder(self) -> None:
        if self.synth is not None:
            self.synth.close()
            self.synth = None
        self.vocoder_released = True
