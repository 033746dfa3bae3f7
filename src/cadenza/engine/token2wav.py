"""Speech tokens -> waveform for CosyVoice 2: flow (tokens -> mel) then HiFT (mel -> 24 kHz), whole or in chunks.

The chunked path follows the reference schedule (spec §7) so that its output matches the reference exactly:
hops of ``25 + prompt_pad``, then doubling up to 100 tokens; 3 look-ahead tokens; the last call recomputes the flow
without chunk masks; HiFT continues from cached mel frames and NSF source samples and cross-fades 3840 samples.
Unlike the reference, the hop lives in the per-request ``TokenChunker`` (never on the shared model), so one request
cannot change the next one's schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from cadenza.models.cosyvoice2.model import CosyVoice2Model
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt

GeneratorForCall = Callable[[int], torch.Generator | None]


@dataclass(frozen=True)
class StreamSchedule:
    """Chunking constants (reference values)."""

    token_hop_len: int = 25  # must equal the flow's training chunk
    token_max_hop_len: int = 100
    stream_scale_factor: int = 2
    mel_cache_len: int = 8  # mel frames of left context HiFT re-reads per chunk
    crossfade: str = "hamming"  # "hamming": reference windows (sum to ~1.08 over the overlap); "hann": sums to exactly 1

    def __post_init__(self) -> None:
        if self.crossfade not in ("hamming", "hann"):
            raise ValueError(f"crossfade must be 'hamming' or 'hann', not {self.crossfade!r}")


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
        pad = math.ceil(self.prompt_tokens / chunk) * chunk - self.prompt_tokens
        self.base_hop = chunk
        self.hop = chunk + pad  # the first chunk ends on a chunk boundary of prompt + generated tokens

    def ready(self, n_tokens: int) -> bool:
        return n_tokens >= self.offset + self.hop + self.lookahead

    def advance(self) -> None:
        self.offset += self.hop
        self.base_hop = min(self.schedule.token_max_hop_len, self.base_hop * self.schedule.stream_scale_factor)
        self.hop = self.base_hop


class Token2Wav:
    """Runs the flow and HiFT of a ``CosyVoice2Model`` for one request at a time (no state kept between calls)."""

    def __init__(self, model: CosyVoice2Model, schedule: StreamSchedule | None = None) -> None:
        self.model = model
        self.schedule = schedule or StreamSchedule()
        self.hop = model.config.hift.hop_length * model.config.token_mel_ratio  # samples per speech token

    @torch.inference_mode()
    def full(
        self, tokens: torch.Tensor, prompt: SpeakerPrompt, speed: float = 1.0, generator: torch.Generator | None = None
    ) -> np.ndarray:
        """All tokens at once (flow without chunk masks). tokens ``[1, T]`` -> float32 ``[960 T / speed]``."""
        mel = self.model.flow.inference(tokens, prompt.flow_prompt_speech, prompt.prompt_mel, prompt.embedding,
                                        streaming=False, finalize=True)
        if speed != 1.0:
            mel = F.interpolate(mel, size=int(mel.shape[2] / speed), mode="linear")
        speech, _ = self.model.hift.inference(mel, generator=generator)
        return speech[0].float().numpy()

    @torch.inference_mode()
    def stream(
        self, tokens: Iterable[int], prompt: SpeakerPrompt, generator_for_call: GeneratorForCall = lambda k: None
    ) -> Iterator[np.ndarray]:
        """Consume token ids as they are produced; yield float32 audio chunks as soon as each is ready.

        ``generator_for_call(k)`` gives the RNG of the k-th HiFT call (tests replay the reference's per-call seeds).
        """
        cfg = self.model.config
        lookahead = cfg.flow.pre_lookahead_len
        ratio = cfg.token_mel_ratio
        chunker = TokenChunker(self.schedule, prompt.flow_prompt_speech.shape[1], lookahead)
        vocoder = _StreamingVocoder(self.model, self.schedule)
        ids: list[int] = []
        for token in tokens:
            ids.append(int(token))
            if not chunker.ready(len(ids)):
                continue
            end = chunker.offset + chunker.hop + lookahead
            mel = self.model.flow.inference(torch.tensor([ids[:end]]), prompt.flow_prompt_speech, prompt.prompt_mel,
                                            prompt.embedding, streaming=True, finalize=False)
            yield vocoder(mel[:, :, ratio * chunker.offset:], final=False, generator=generator_for_call(vocoder.calls))
            chunker.advance()
        if not ids:
            return
        # Last chunk (always run: it also releases the held-back overlap). The reference computes it without chunk
        # masks (model.py does not pass stream=True on the final call); kept for parity.
        mel = self.model.flow.inference(torch.tensor([ids]), prompt.flow_prompt_speech, prompt.prompt_mel,
                                        prompt.embedding, streaming=False, finalize=True)
        yield vocoder(mel[:, :, ratio * chunker.offset:], final=True, generator=generator_for_call(vocoder.calls))


class _StreamingVocoder:
    """HiFT over successive mel chunks with mel/source caches and a cross-fade of the overlapping samples."""

    def __init__(self, model: CosyVoice2Model, schedule: StreamSchedule) -> None:
        self.hift = model.hift
        self.mel_cache_len = schedule.mel_cache_len
        self.overlap = schedule.mel_cache_len * model.config.hift.hop_length
        self.fade_in, self.fade_out = crossfade_windows(self.overlap, schedule.crossfade)
        self.mel_cache: torch.Tensor | None = None
        self.source_cache: torch.Tensor | None = None
        self.tail: np.ndarray | None = None
        self.calls = 0

    def __call__(self, mel: torch.Tensor, final: bool, generator: torch.Generator | None) -> np.ndarray:
        if self.mel_cache is not None:
            mel = torch.cat([self.mel_cache, mel], dim=2)
        speech, source = self.hift.inference(mel, cache_source=self.source_cache, generator=generator)
        self.calls += 1
        out = speech[0].float().numpy().copy()
        if self.tail is not None:
            n = self.overlap
            out[:n] = (out[:n].astype(np.float64) * self.fade_in + self.tail.astype(np.float64) * self.fade_out).astype(np.float32)
        if final:
            return out
        self.mel_cache = mel[:, :, -self.mel_cache_len:]
        self.source_cache = source[:, :, -self.overlap:]
        self.tail = out[-self.overlap:].copy()
        return out[: -self.overlap]
