"""Speech tokens -> waveform for CosyVoice 2: flow (tokens -> mel) then HiFT (mel -> 24 kHz), whole or in chunks.

Chunks follow the ``StreamSchedule`` of ``engine/stream_schedule.py`` (docs/design.md, "CosyVoice 2 streaming
schedule"); HiFT continues from cached mel frames and NSF source samples and cross-fades the overlap. Two flavours:
* ``StreamSchedule.reference()`` reproduces the reference exactly: every chunk re-runs the flow over prompt + all
  tokens so far (cost grows with the chunk index), the last chunk is recomputed without chunk masks, and the
  cross-fade windows sum to ~1.08.
* the default computes each chunk once with the cached, incremental flow (``IncrementalFlow``; cost per chunk
  independent of its index), keeps chunk masks on the last chunk too (so it continues the earlier chunks
  exactly instead of switching attention pattern for the last frames), and cross-fades with windows that sum to 1.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from cadenza.audio.frame_stretch import FrameStretch
from cadenza.audio.time_scale import TIME_SCALE_METHODS, time_scale, time_scaler
from cadenza.engine.stream_schedule import StreamSchedule, TokenChunker, crossfade_windows
from cadenza.models.cosyvoice2.flow_rate import FrameRate
from cadenza.models.cosyvoice2.model import CosyVoice2Model
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt

log = logging.getLogger(__name__)
GeneratorForCall = Callable[[int], torch.Generator | None]


class Token2Wav:
    """Runs the flow and HiFT of a ``CosyVoice2Model`` for one request at a time (no state kept between calls)."""

    def __init__(self, model: CosyVoice2Model, schedule: StreamSchedule | None = None) -> None:
        self.model = model
        self.schedule = schedule or StreamSchedule()
        self.hop = model.config.hift.hop_length * model.config.flow.token_mel_ratio  # samples per speech token

    @torch.inference_mode()
    def full(
        self, tokens: torch.Tensor, prompt: SpeakerPrompt, speed: float = 1.0, generator: torch.Generator | None = None
    ) -> np.ndarray:
        """All tokens at once (flow without chunk masks). tokens ``[1, T]`` -> float32 ``[960 T / speed]`` (the flow's
        ``FrameRate.total`` frames x 480 with ``speed_method="flow"``)."""
        by_flow = speed != 1.0 and self.schedule.speed_method == "flow"
        mel = self.model.flow.inference(tokens, prompt.flow_prompt_speech, prompt.prompt_mel, prompt.embedding,
                                        streaming=False, finalize=True, speed=speed if by_flow else 1.0)
        if speed != 1.0 and self.schedule.speed_method == "mel":
            mel = F.interpolate(mel, size=int(mel.shape[2] / speed), mode="linear")
        speech, _ = self.model.hift.inference(mel, generator=generator)
        audio = speech[0].float().cpu().numpy()
        if speed != 1.0 and self.schedule.speed_method in TIME_SCALE_METHODS:
            audio = time_scale(audio, speed, self.model.config.hift.sampling_rate, self.schedule.speed_method)
        return audio

    @torch.inference_mode()
    def stream(
        self, tokens: Iterable[int], prompt: SpeakerPrompt, generator_for_call: GeneratorForCall = lambda k: None,
        speed: float = 1.0,
    ) -> Iterator[np.ndarray]:
        """Consume token ids as they are produced; yield float32 audio chunks as soon as each is ready.

        ``generator_for_call(k)`` gives the RNG of the k-th HiFT call (tests replay the reference's per-call seeds).
        ``speed``: speaking rate (``StreamSchedule.speed_method``, see ``StreamSynthesis``).
        """
        synth = StreamSynthesis(self.model, prompt, self.schedule, generator_for_call, speed=speed)
        try:
            ids: list[int] = []
            for token in tokens:
                ids.append(int(token))
                if synth.ready(len(ids)):
                    yield synth.next_chunk(ids)
            if ids:
                yield synth.finish(ids)
        finally:
            synth.close()


class _RecomputeFlow:
    """Reference flow stage: every chunk re-runs the flow over prompt + all tokens so far and keeps the new frames.

    "New" counts the frames returned so far, not the chunk's first token: a ``finalize=False`` call gives no frames
    for the last ``pre_lookahead_len`` tokens of its input, so a chunk whose look-ahead is cut short by the end of
    ``ids`` returns fewer frames and the following chunk (or the final one) returns the rest (issue #19: slicing at
    the chunk's first token lost them).
    """

    def __init__(self, model: CosyVoice2Model, prompt: SpeakerPrompt, final_full_attention: bool,
                 frames_done: int = 0, speed: float = 1.0) -> None:
        """frames_done: mel frames of this request already returned (by the flow stage this one replaces); speed:
        the flow's speaking rate (``speed_method="flow"``)."""
        self.flow, self.prompt = model.flow, prompt
        self.ratio = model.config.flow.token_mel_ratio
        self.lookahead = model.config.flow.pre_lookahead_len
        self.final_full_attention = final_full_attention
        self.frames_done = frames_done
        self.speed = speed
        self.rate = None if speed == 1.0 else FrameRate(speed, prompt.prompt_mel.size(1))

    def _frames(self, n_tokens: int, final: bool) -> int:
        """Frames after the prompt a call on ``n_tokens`` tokens with complete look-ahead gives."""
        prompt = self.prompt.prompt_mel.size(1)
        mu = self.ratio * (self.prompt.flow_prompt_speech.size(1) + n_tokens)
        return (mu if self.rate is None else self.rate.frames(mu, final)) - prompt

    def _mel(self, ids: list[int], streaming: bool, finalize: bool) -> torch.Tensor:
        """The frames of ``ids`` after those returned already: ``[1, mel, frames]``."""
        p = self.prompt
        mel = self.flow.inference(torch.tensor([ids]), p.flow_prompt_speech, p.prompt_mel, p.embedding,
                                  streaming=streaming, finalize=finalize, speed=self.speed)[:, :, self.frames_done :]
        self.frames_done += mel.size(2)
        return mel

    def chunk(self, ids: list[int], offset: int, end: int, lookahead: int) -> torch.Tensor:
        """The frames of ``ids[offset:end]`` whose ``lookahead`` tokens exist (the reference's ``finalize=False``
        call on ``ids[:end + lookahead]``), with any left over from earlier chunks."""
        seen = ids[: end + lookahead]
        if len(seen) <= self.lookahead or self._frames(len(seen) - self.lookahead, False) <= self.frames_done:
            return self._empty()  # no token gained its look-ahead (a call on so few tokens would be refused)
        return self._mel(seen, streaming=True, finalize=False)

    def final(self, ids: list[int], offset: int) -> torch.Tensor:
        if self._frames(len(ids), True) <= self.frames_done:
            return self._empty()
        return self._mel(ids, streaming=not self.final_full_attention, finalize=True)

    def _empty(self) -> torch.Tensor:
        return torch.zeros(1, self.flow.cfg.output_size, 0, device=self.flow.spk_embed_affine_layer.weight.device)

    def close(self) -> None:
        pass


class _IncrementalFlowStage:
    """Cached flow stage: each token's mel is computed once (``IncrementalFlow``, its ``session``)."""

    def __init__(self, model: CosyVoice2Model, prompt: SpeakerPrompt, session=None, speed: float = 1.0) -> None:
        """session: an ``IncrementalFlow`` of this prompt to continue (e.g. a primed one); default a new one.
        speed: the flow's speaking rate (``speed_method="flow"``)."""
        from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow

        self.session = session or IncrementalFlow(model.flow, prompt.flow_prompt_speech, prompt.prompt_mel,
                                                  prompt.embedding)
        if speed != 1.0:
            self.session.set_speed(speed)

    def chunk(self, ids: list[int], offset: int, end: int, lookahead: int) -> torch.Tensor:
        return self.session.push(*self.push_args(ids, offset, end, lookahead))

    def final(self, ids: list[int], offset: int) -> torch.Tensor:
        return self.session.push(*self.push_args(ids, offset, None, 0))

    @staticmethod
    def push_args(
        ids: list[int], offset: int, end: int | None, lookahead: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """(tokens, look-ahead, final) of the push of ``ids[offset:end]`` (``end`` None: the final push)."""
        if end is None:
            return torch.tensor([ids[offset:]]), None, True
        return torch.tensor([ids[offset:end]]), torch.tensor([ids[end : end + lookahead]]), False

    def close(self) -> None:
        self.session.close()


class StreamSynthesis:
    """One request's token -> audio state: chunk schedule, flow stage, HiFT caches. Driven step by step.

    ``ready(n)`` says whether ``n`` tokens are enough for the next chunk; ``next_chunk(ids)`` returns its audio;
    ``finish(ids)`` returns the rest (always call it: it also releases the held-back overlap); ``close()`` frees
    every buffer.

    ``speed != 1``: by ``StreamSchedule.speed_method``, either each chunk's audio goes through a streaming
    time-scale (``audio/time_scale.py``: by default the phase vocoder to speed up and WSOLA to slow down, the same
    samples as time-scaling the whole; they hold back ~50 / ~55-70 ms of look-ahead until the next chunk or the end),
    or each chunk's mel is stretched in time by ``1 / speed`` (``FrameStretch``, the streaming form of
    the whole-utterance ``F.interpolate`` of ``Token2Wav.full``) between the flow and HiFT, which rebuilds the pitch
    from the frames, holding back at most one mel frame, or the flow itself renders ``1 / speed`` as many frames
    (``"flow"``: ``flow_rate.FrameRate`` inside ``IncrementalFlow``, holding back at most one frame until the next
    chunk; no flow ahead then). Either way the chunk schedule (in tokens) is unchanged, so the first chunk comes as
    early as at speed 1 (docs/controls.md, "Speed").
    """

    def __init__(self, model: CosyVoice2Model, prompt: SpeakerPrompt, schedule: StreamSchedule,
                 generator_for_call: GeneratorForCall = lambda k: None, flow_session=None,
                 speed: float = 1.0, split_chunks: bool = True) -> None:
        """flow_session: the ``IncrementalFlow`` of ``prompt`` to start from (a primed copy; taken over: ``close``
        frees it); only with an incremental schedule. speed: speaking rate in [0.5, 2]. split_chunks: cut chunks at
        their ``split_point`` (off where flow ahead can never run: it saves the second estimator call, ~6 % of a
        stream's time on the built-in model)."""
        method = schedule.speed_method if speed != 1.0 else None
        self.stretch = FrameStretch(speed) if method == "mel" else None
        self.time_scale = (time_scaler(speed, model.config.hift.sampling_rate, method)
                           if method in TIME_SCALE_METHODS else None)
        self.flow_speed = speed if method == "flow" else 1.0
        self.lookahead = model.config.flow.pre_lookahead_len
        self.chunker = TokenChunker(schedule, prompt.flow_prompt_speech.shape[1], self.lookahead)
        if flow_session is not None and not schedule.incremental:
            raise ValueError("a flow session needs an incremental schedule")
        self.flow = (_IncrementalFlowStage(model, prompt, flow_session, self.flow_speed) if schedule.incremental
                     else _RecomputeFlow(model, prompt, schedule.final_full_attention, speed=self.flow_speed))
        self._model, self._prompt, self._schedule = model, prompt, schedule
        self.vocoder = _StreamingVocoder(model, schedule)
        self.generator_for_call = generator_for_call
        self.chunks = 0
        # Flow computed ahead (``flow_ahead``): the mel of the next chunk's first ``_ahead_tokens`` tokens.
        self._ahead: list[torch.Tensor] = []
        self._ahead_tokens = 0
        self.split_chunks = split_chunks
        flow_cfg = model.config.flow
        frame_chunk = flow_cfg.estimator.static_chunk_size
        # Tokens between two points where both the encoder's and the estimator's attention chunks end.
        self._boundary = math.lcm(flow_cfg.encoder.static_chunk_size,
                                  frame_chunk // math.gcd(frame_chunk, flow_cfg.token_mel_ratio))

    def ready(self, n_tokens: int) -> bool:
        return self.chunker.ready(n_tokens)

    @property
    def flow_session(self):
        """The cached flow (``IncrementalFlow``) this stream runs on, or ``None`` while it recomputes the prefix per
        chunk (``StreamSchedule.reference()``, or past ``flow_cache_limit_mb``): the one place that tells them apart."""
        return getattr(self.flow, "session", None)

    @torch.inference_mode()
    def next_chunk(self, ids: list[int]) -> np.ndarray:
        return self.vocode(self.flow_mel(ids, final=False), final=False)

    @torch.inference_mode()
    def finish(self, ids: list[int]) -> np.ndarray:
        return self.vocode(self.flow_mel(ids, final=True), final=True)

    def flow_mel(self, ids: list[int], final: bool) -> torch.Tensor:
        """The mel ``[1, mel, frames]`` of the next chunk (``final``: of all remaining tokens); follow with ``vocode``."""
        self.cut_at_split(ids)
        start = self.flow_start
        if final:
            mel = self.flow.final(ids, start)
        else:
            mel = self.flow.chunk(ids, start, self.chunker.offset + self.chunker.hop, self.lookahead)
        mel = self.with_flow_ahead(mel)
        self.bound_flow_cache()
        return mel

    @property
    def flow_start(self) -> int:
        """The first token of the next chunk whose mel is still to compute (after any computed ahead)."""
        return self.chunker.offset + self._ahead_tokens

    def with_flow_ahead(self, mel: torch.Tensor) -> torch.Tensor:
        """The chunk's whole mel: what was computed ahead, then ``mel`` (the rest)."""
        if not self._ahead:
            return mel
        mel = torch.cat([*self._ahead, mel], dim=2)
        self._ahead, self._ahead_tokens = [], 0
        return mel

    def split_point(self) -> int | None:
        """The token where the next chunk's flow is cut in two, whether the first piece runs ahead (``flow_ahead``)
        or in the chunk's own call: the last point inside the chunk where the flow's attention chunks (of prompt +
        generated tokens) end. Each frame attends up to the end of its own attention chunk, so the first piece's
        frames are final there. The cut is fixed by the schedule alone, never by how far the LM has got when a
        worker is idle: other pushes give the same frames only to float round-off (other matrix shapes), so a cut
        that moved with timing made a seed's audio differ by a bit from one run to the next. None: one piece (the
        first chunk, which never runs ahead; the recomputing flow, which has no state to carry frames; a flow
        speaking rate, whose estimator chunks do not end on token boundaries; a chunk whose first piece is done;
        ``split_chunks`` off)."""
        if (not self.split_chunks or self.flow_session is None or self.flow_speed != 1.0 or self.chunks == 0
                or self._ahead_tokens):
            return None
        prompt, start = self._prompt.flow_prompt_speech.shape[1], self.chunker.offset
        point = (prompt + start + self.chunker.hop - 1) // self._boundary * self._boundary - prompt
        return point if point > start else None

    def flow_ahead_tokens(self, n_tokens: int) -> int:
        """How many of the next chunk's tokens ``flow_ahead`` can compute now, with ``n_tokens`` generated: those
        before its ``split_point`` once that point's look-ahead has arrived, else 0."""
        point = self.split_point()
        if point is None or point + self.lookahead > n_tokens:
            return 0
        return point - self.flow_start

    def cut_at_split(self, ids: list[int]) -> None:
        """Before the chunk's own flow call: compute the first piece (``split_point``) now if it did not run ahead,
        so the chunk is cut in the same place either way. A final chunk is cut only where flow ahead could have
        run: its split point's look-ahead is among ``ids``."""
        if n := self.flow_ahead_tokens(len(ids)):
            self.flow_ahead(ids, n)

    @torch.inference_mode()
    def flow_ahead(self, ids: list[int], n: int) -> None:
        """Compute the mel of the next ``n`` tokens of the next chunk now (``n`` from ``flow_ahead_tokens``), while
        the chunk's last tokens are still being decoded; its ``flow_mel`` then computes only the rest."""
        start = self.flow_start
        self.keep_flow_ahead(self.flow.chunk(ids, start, start + n, self.lookahead), n)

    def flow_ahead_frames(self, n: int) -> int:
        """Estimator frames of ``flow_ahead(ids, n)`` (equal counts batch in ``flow_ahead_many``)."""
        return self.flow_session.frames_to_compute(n)

    def keep_flow_ahead(self, mel: torch.Tensor, n: int) -> None:
        self._ahead.append(mel)
        self._ahead_tokens += n
        self.bound_flow_cache()

    @property
    def flow_nbytes(self) -> int:
        """Bytes of cached flow state this stream holds (0 once it recomputes the prefix per chunk)."""
        session = self.flow_session
        return 0 if session is None else session.nbytes

    def bound_flow_cache(self) -> None:
        """Past ``flow_cache_limit_mb`` of cached flow state, free it and go on recomputing the prefix per chunk."""
        limit = self._schedule.flow_cache_limit_mb
        if limit is not None and self.flow_nbytes > limit * 2**20:
            self.free_flow_cache(f"limit {limit:.0f} MiB")

    def free_flow_cache(self, why: str) -> None:
        """Free the cached flow state; later chunks recompute the prefix (the same mel within float round-off)."""
        session = self.flow_session
        if session is None:
            return
        log.info("flow cache of a stream at %.0f MiB after %d chunks (%s): recomputing from now on",
                 session.nbytes / 2**20, self.chunks + 1, why)
        frames_done = session.frames_emitted
        self.flow.close()
        self.flow = _RecomputeFlow(self._model, self._prompt, self._schedule.final_full_attention, frames_done,
                                   self.flow_speed)

    def flow_frames(self, n_tokens: int, final: bool) -> int | None:
        """Estimator frames of the next chunk's flow, when it can be batched with other requests' (else None)."""
        session = self.flow_session
        if session is None:
            return None
        start = self.flow_start + self.flow_ahead_tokens(n_tokens)  # the piece after the split (``cut_at_split``)
        return session.frames_to_compute(n_tokens - start if final
                                         else self.chunker.offset + self.chunker.hop - start, final)

    @torch.inference_mode()
    def vocode(self, mel: torch.Tensor, final: bool) -> np.ndarray:
        """Audio of the chunk whose mel ``flow_mel`` (or ``flow_mels``) returned; advances the schedule."""
        audio = self.vocoder(self.stretched(mel, final), final=final, generator=self._next_vocoder_call(final))
        return self.time_scaled(audio, final)

    def time_scaled(self, audio: np.ndarray, final: bool) -> np.ndarray:
        """A chunk's audio at the request's speaking rate (itself at speed 1 or with ``speed_method="mel"``)."""
        if self.time_scale is None:
            return audio
        out = self.time_scale.push(audio)
        return np.concatenate([out, self.time_scale.finish()]) if final else out

    def stretched(self, mel: torch.Tensor, final: bool) -> torch.Tensor:
        """The chunk's mel at the request's speaking rate (itself at speed 1)."""
        if self.stretch is None:
            return mel
        out = self.stretch.push(mel)
        return torch.cat([out, self.stretch.finish()], dim=2) if final else out

    def _next_vocoder_call(self, final: bool) -> torch.Generator | None:
        """Advance the schedule past the chunk being vocoded; the RNG of its HiFT call."""
        if not final:
            self.chunker.advance()
        self.chunks += 1
        return self.generator_for_call(self.vocoder.calls)

    def close(self) -> None:
        self.flow.close()
        self.vocoder.close()


@torch.inference_mode()
def flow_mels(synths: list[StreamSynthesis], ids: list[list[int]], finals: list[bool]) -> list[torch.Tensor]:
    """``flow_mel`` of several requests; the incremental ones run through ``IncrementalFlow.push_many`` (their
    estimator calls batched where frame counts match). On an error every request given may be unusable."""
    from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow

    mels: list[torch.Tensor | None] = [None] * len(synths)
    batch = [i for i, s in enumerate(synths) if s.flow_session is not None]
    if len(batch) > 1:
        for i in batch:  # each stream's first piece as its own call would cut it; the rest batched
            synths[i].cut_at_split(ids[i])
        batch = [i for i in batch if synths[i].flow_session is not None]  # a cut may pass flow_cache_limit_mb
    if len(batch) > 1:
        args = []
        for i in batch:
            synth = synths[i]
            end = None if finals[i] else synth.chunker.offset + synth.chunker.hop
            args.append(_IncrementalFlowStage.push_args(ids[i], synth.flow_start, end, synth.lookahead))
        tokens, lookaheads, final_flags = (list(column) for column in zip(*args))
        outs = IncrementalFlow.push_many([synths[i].flow_session for i in batch], tokens, lookaheads, final_flags)
        for i, mel in zip(batch, outs):
            mels[i] = synths[i].with_flow_ahead(mel)
            synths[i].bound_flow_cache()
    for i, synth in enumerate(synths):
        if mels[i] is None:
            mels[i] = synth.flow_mel(ids[i], finals[i])
    return mels


@torch.inference_mode()
def flow_ahead_many(synths: list[StreamSynthesis], ids: list[list[int]], ns: list[int]) -> None:
    """``flow_ahead`` of several requests, their estimator calls batched where frame counts match
    (``IncrementalFlow.push_many``). On an error every request given may be unusable."""
    from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow

    if len(synths) == 1:
        synths[0].flow_ahead(ids[0], ns[0])
        return
    args = [_IncrementalFlowStage.push_args(i, s.flow_start, s.flow_start + n, s.lookahead)
            for s, i, n in zip(synths, ids, ns)]
    tokens, lookaheads, finals = (list(column) for column in zip(*args))
    outs = IncrementalFlow.push_many([s.flow_session for s in synths], tokens, lookaheads, finals)
    for synth, mel, n in zip(synths, outs, ns):
        synth.keep_flow_ahead(mel, n)


@torch.inference_mode()
def vocode_many(synths: list[StreamSynthesis], mels: list[torch.Tensor], finals: list[bool]) -> list[np.ndarray]:
    """``vocode`` of several requests: the HiFT calls of those whose input (mel cache + chunk) has as many frames and
    whose source cache as many samples run as one batch. Each row's source noise comes from its own request's
    generator, drawn as a call of its own would draw it, and each row keeps its own caches, so the audio equals
    separate ``vocode`` calls (up to float32 round-off of the batched convolutions). On an error every request given
    may be unusable."""
    mels = [synth.stretched(mel, final) for synth, mel, final in zip(synths, mels, finals)]
    generators = [synth._next_vocoder_call(final) for synth, final in zip(synths, finals)]
    inputs = [synth.vocoder.prepare(mel) for synth, mel in zip(synths, mels)]
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (mel_in, cache) in enumerate(inputs):
        groups.setdefault((mel_in.size(2), 0 if cache is None else cache.size(2)), []).append(i)
    audio: list[np.ndarray | None] = [None] * len(synths)
    for members in groups.values():
        hift = synths[members[0]].vocoder.hift
        mel_in = torch.cat([inputs[i][0] for i in members])
        caches = [inputs[i][1] for i in members]
        noise = hift.draw_noise(mel_in.size(2), [generators[i] for i in members])
        speech, source = hift.inference(mel_in, cache_source=None if caches[0] is None else torch.cat(caches),
                                        noise=noise)
        for row, i in enumerate(members):
            audio[i] = synths[i].time_scaled(
                synths[i].vocoder.finish(inputs[i][0], speech[row : row + 1], source[row : row + 1], finals[i]),
                finals[i])
    return audio


class _StreamingVocoder:
    """HiFT over successive mel chunks with mel/source caches and a cross-fade of the overlapping samples."""

    def __init__(self, model: CosyVoice2Model, schedule: StreamSchedule) -> None:
        self.hift = model.hift
        self.mel_cache_len = schedule.mel_cache_len
        self.frame_samples = model.config.hift.hop_length
        self.overlap = schedule.mel_cache_len * self.frame_samples
        self.crossfade = schedule.crossfade
        self.fade_in, self.fade_out = crossfade_windows(self.overlap, schedule.crossfade)
        self.mel_cache: torch.Tensor | None = None
        self.source_cache: torch.Tensor | None = None
        self.tail: np.ndarray | None = None
        self.calls = 0

    def __call__(self, mel: torch.Tensor, final: bool, generator: torch.Generator | None) -> np.ndarray:
        mel, cache_source = self.prepare(mel)
        speech, source = self.hift.inference(mel, cache_source=cache_source, generator=generator)
        return self.finish(mel, speech, source, final)

    def prepare(self, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The HiFT input of a chunk's mel ``[1, mel, F]``: (cached mel frames ++ mel, source cache ``[1, 1, S]``)."""
        if self.mel_cache is not None:
            mel = torch.cat([self.mel_cache, mel], dim=2)
        return mel, self.source_cache

    def finish(self, mel: torch.Tensor, speech: torch.Tensor, source: torch.Tensor, final: bool) -> np.ndarray:
        """HiFT's ``speech [1, L]`` / ``source [1, 1, L]`` for the ``prepare`` d ``mel`` -> this chunk's audio (the
        overlap with the previous chunk cross-faded; the tail of a non-final chunk held back); updates the caches."""
        self.calls += 1
        out = speech[0].float().cpu().numpy().copy()  # copy: on CPU .numpy() shares the tensor's memory
        if self.tail is not None:
            n = self.tail.size
            fade_in, fade_out = ((self.fade_in, self.fade_out) if n == self.overlap
                                 else crossfade_windows(n, self.crossfade))
            mixed = out[:n].astype(np.float64) * fade_in + self.tail.astype(np.float64) * fade_out
            out[:n] = mixed.astype(np.float32)
        if final:
            return out
        # A first chunk shorter than mel_cache_len frames is cached (and held back) whole: the overlap shrinks to it,
        # so every chunk's samples still add up to frame_samples x its frames.
        keep = min(self.mel_cache_len, mel.size(2))
        n = keep * self.frame_samples
        # Copies, not views: a view would keep the whole (possibly batched) call's tensors alive.
        self.mel_cache = mel[:, :, mel.size(2) - keep :].clone()
        self.source_cache = source[:, :, source.size(2) - n :].clone()
        self.tail = out[out.size - n :].copy()
        return out[: out.size - n]

    def close(self) -> None:
        self.mel_cache = self.source_cache = self.tail = None
