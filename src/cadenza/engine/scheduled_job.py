"""What the CosyVoice 2 scheduler keeps per request (``Job``: the board's fields, the LM's and the vocoder's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cadenza.engine.job_board import DONE, BoardJob
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.token2wav import StreamSynthesis
from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow
from cadenza.models.cosyvoice2.lm_decoding import BistreamDecoder, UnistreamDecoder

__all__ = ["DONE", "Job"]


@dataclass(eq=False, kw_only=True)
class Job(BoardJob):
    """One request's live state inside the scheduler. ``decoder`` belongs to the LM worker, ``synth`` to the vocoder
    worker: each is touched (and freed) by its own worker only. Flags and buffers change under the board's lock."""

    request: SynthesisRequest
    decoder: UnistreamDecoder | BistreamDecoder | None
    synth: StreamSynthesis | None = None
    flow_session: IncrementalFlow | None = None  # primed flow state of its voice, taken over by ``synth``
    # Its voice's primed flow state is not kept: its vocoder worker computes it first, while the LM decodes.
    needs_priming: bool = False
    ids: list[int] = field(default_factory=list)  # appended by the LM worker only; read by the vocoder worker
    lm_done: bool = False  # set after the last token is in ``ids``
    vocoder_released: bool = False  # the vocoder worker freed (or never had) ``synth``
    vocoder_worker: int = 0  # index of the vocoder worker that owns ``synth`` (set at admission)
    first_chunk_tokens: int = 0  # tokens its first streaming chunk needs (hop + look-ahead)
    ready_since: int | None = None  # LM step count when its ready flow chunk started waiting for batch partners
    flow_ahead_tokens: int = 0  # tokens whose flow a vocoder worker computed ahead of their chunk
    flow_bytes: int = 0  # cached flow state it held after its vocoder worker's last piece of work (the memory budget)

    @property
    def released(self) -> bool:
        return self.decoder is None and self.vocoder_released

    def release_all(self) -> None:
        self.release_lm()
        self.release_vocoder()

    def release_lm(self) -> None:
        if self.decoder is not None:
            self.decoder.close()
            self.decoder = None

    def release_vocoder(self) -> None:
        if self.flow_session is not None:
            self.flow_session.close()
            self.flow_session = None
        if self.synth is not None:
            self.synth.close()
            self.synth = None
        self.vocoder_released = True
