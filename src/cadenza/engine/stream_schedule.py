"""How a CosyVoice 2 request is cut into chunks: the stream schedule, the per-request token chunker, cross-fades.

The reference schedule (docs/design.md, "CosyVoice 2 streaming schedule"): hops of ``25 + prompt_pad`` tokens, then
doubling up to 100; 3 look-ahead tokens. Ours by default: a first hop of 25 whatever the prompt's length, the
second one back on the flow's attention-chunk grid. The hop lives in the per-request ``TokenChunker`` (the reference
keeps it on the shared model, so one request changes the next one's schedule). ``engine/token2wav.py`` runs the
chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

SPEED_METHODS = ("auto", "phase_vocoder", "wsola", "mel", "flow")


@dataclass(frozen=True)
class StreamSchedule:
    """How a request is cut into chunks and how chunks are computed and joined."""

    token_hop_len: int = 25  # must equal the flow's training chunk
    token_max_hop_len: int = 100
    stream_scale_factor: int = 2
    # The first hop. True (the reference): ``token_hop_len + pad`` tokens, so that prompt + first hop ends on a
    # boundary of the flow's attention chunks (25 to 49 tokens, by the prompt's length). False: ``token_hop_len``
    # tokens whatever the prompt; the frames of the last, partial attention chunk are then computed from the tokens
    # so far (as an utterance's last frames are, and as the flow was trained with), and the second hop ends back on
    # the grid. Saves up to 24 tokens of LM and flow before the first audio of a voice whose prompt is not a
    # multiple of 25 tokens (docs/performance.md, "The first chunk of any voice").
    first_hop_on_grid: bool = False
    # Off the grid, the first hop's length in tokens (None: ``token_hop_len``). Shorter means earlier first audio but
    # a first chunk of less audio (hop x 40 ms less the 160 ms HiFT holds back) that the second must follow in time:
    # for hardware that makes a chunk far faster than real time (docs/performance.md, "The first chunk of any voice").
    first_hop_len: int | None = None
    mel_cache_len: int = 8  # mel frames of left context HiFT re-reads per chunk
    crossfade: str = "hann"  # "hamming": reference windows (sum to ~1.08 over the overlap); "hann": sums to 1
    incremental: bool = True  # cached flow (each chunk computed once) instead of re-running the prefix
    final_full_attention: bool = False  # reference: the last chunk is computed without chunk masks
    # A request whose cached flow state grows past this many MiB continues by recomputing the prefix (the same mel
    # within float round-off, no cache kept, cost growing with length): bounds the memory of very long streams
    # (the released flow caches ~4.4 MiB of estimator keys/values per mel frame, 50 frames a second). None: no bound.
    flow_cache_limit_mb: float | None = 4096.0
    # Primed prompts (``engine/primed_prompts.py``): the flow state of each voice's prompt, kept for the voice's next
    # requests up to this many MiB in all (0: off). Saves a saved voice's prompt frames in every first chunk.
    primed_prompt_cache_mb: float = 1024.0
    # How ``speed != 1`` changes the rate (docs/controls.md, "Speed"): "auto", "phase_vocoder" or "wsola" time-scale
    # the audio (pitch kept; ``audio/time_scale.py``: "auto" is the phase vocoder to speed up, WSOLA to slow down,
    # what kept the most words at each rate),
    # "mel" stretches the flow's mel before HiFT (what the release's non-streaming speed does), "flow" renders the
    # tokens at 1/speed as many frames inside the flow (``models/cosyvoice2/flow_rate.py``; for a flow trained on
    # speaking-rate pairs; a model folder's cadenza.json may name it).
    speed_method: str = "auto"

    def __post_init__(self) -> None:
        if self.crossfade not in ("hamming", "hann"):
            raise ValueError(f"crossfade must be 'hamming' or 'hann', not {self.crossfade!r}")
        if self.speed_method not in SPEED_METHODS:
            raise ValueError(f"speed_method must be one of {', '.join(SPEED_METHODS)}, not {self.speed_method!r}")
        if self.token_hop_len <= 0 or self.token_max_hop_len < self.token_hop_len or self.stream_scale_factor < 1:
            raise ValueError("bad hop lengths")
        if self.first_hop_len is not None and (self.first_hop_on_grid
                                                or not 1 <= self.first_hop_len <= self.token_max_hop_len):
            raise ValueError(f"first_hop_len must be from 1 to token_max_hop_len ({self.token_max_hop_len}) tokens, "
                             f"and only with first_hop_on_grid False; got {self.first_hop_len}")
        if self.primed_prompt_cache_mb < 0:
            raise ValueError(f"primed_prompt_cache_mb must be >= 0, not {self.primed_prompt_cache_mb}")
        if self.flow_cache_limit_mb is not None and self.flow_cache_limit_mb < 0:
            raise ValueError(f"flow_cache_limit_mb must be >= 0 or None, not {self.flow_cache_limit_mb}")

    @classmethod
    def reference(cls) -> StreamSchedule:
        """Bit-for-bit the reference's streaming (parity mode)."""
        return cls(crossfade="hamming", incremental=False, final_full_attention=True, speed_method="mel",
                   first_hop_on_grid=True)


def steady_hops(schedule: StreamSchedule) -> StreamSchedule:
    """``schedule`` with every hop one attention chunk (``token_hop_len``), none growing: for a source that arrives
    in real time (live voice conversion), where a longer hop only waits longer for its tokens."""
    return replace(schedule, token_max_hop_len=schedule.token_hop_len)


def crossfade_windows(n: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(fade-in, fade-out) float64 weights of length ``n``."""
    if kind == "hamming":
        w = np.hamming(2 * n)  # reference: the halves sum to 1.08 at the centre, so the overlap is ~8 % louder
    else:
        w = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(2 * n) / (2 * n))  # periodic Hann: w[i] + w[i+n] == 1
    return w[:n], w[n:]


@dataclass
class TokenChunker:
    """Decides when enough speech tokens exist for the next flow call; owned by one request."""

    schedule: StreamSchedule
    prompt_tokens: int
    lookahead: int
    offset: int = 0  # tokens already turned into audio
    base_hop: int = field(init=False)
    hop: int = field(init=False)  # tokens the next chunk covers

    def __post_init__(self) -> None:
        chunk = self.schedule.token_hop_len
        if self.schedule.first_hop_on_grid:  # the first chunk ends on a chunk boundary of prompt + generated tokens
            self.base_hop = chunk
            self.hop = chunk + self._to_boundary()
        else:
            self.base_hop = self.hop = self.schedule.first_hop_len or chunk

    def _to_boundary(self) -> int:
        """Tokens from where the next hop starts (prompt + offset) to the next attention-chunk boundary (0 on one)."""
        return -(self.prompt_tokens + self.offset) % self.schedule.token_hop_len

    def ready(self, n_tokens: int) -> bool:
        return n_tokens >= self.offset + self.hop + self.lookahead

    def advance(self) -> None:
        self.offset += self.hop
        self.base_hop = min(self.schedule.token_max_hop_len, self.base_hop * self.schedule.stream_scale_factor)
        if self.schedule.first_hop_on_grid:  # the reference's hops, whatever they are
            self.hop = self.base_hop
            return
        # Every later chunk ends on the grid, so only the first chunk ever has frames of a partial attention chunk:
        # at the last boundary within ``base_hop`` tokens, or a later one if that chunk would hold less than half of
        # ``base_hop`` (a chunk too short to play while the next one is made).
        chunk, start = self.schedule.token_hop_len, self.prompt_tokens + self.offset
        end = (start + self.base_hop) // chunk * chunk
        while end - start < max(1, self.base_hop // 2):
            end += chunk
        self.hop = end - start
