"""Live voice conversion: source audio pushed as it is recorded, the same words in another voice out as they are made.

The speech tokenizer is an offline model (the release's S3 tokenizer and the built-in frame classifier both attend
over their whole input), so ``LiveTokenizer`` reads the source in overlapping windows: each window starts
``LEFT_CONTEXT_TOKENS`` before the ``STEP_TOKENS`` it commits and ends ``LOOKAHEAD_TOKENS`` after them, so every
committed token saw 2 s of the past and at least 0.24 s of the future, and the ids do not depend on how the source
was cut. On the built-in model this loses no words against reading the source whole: 30 unseen sentences converted
into its default voice read Whisper base WER 0.441 live, 0.435 whole (``benchmarks/live_voice_conversion.py --asr``;
20 of its teacher's readings: 0.243 with 2 s / 0.4 s windows, 0.212 with 1 s / 0.2 s, 0.221 whole; 2026-12-07, AMD
EPYC Zen 4).

The tokens go to the engine as a live source (``SynthesisRequest.live_source``): its flow renders them an attention
chunk (25 tokens, 1 s) at a time, hops that do not grow (``steady_hops``). The converted audio for a moment of the
source therefore comes out about 1.4 s after that moment was pushed plus the time to compute it: the rest of its
1 s chunk, the flow's 3-token look-ahead (0.12 s), the tokenizer's (0.24 s and its 0.2 s step) and HiFT's 0.16 s
held back; ``benchmarks/live_voice_conversion.py`` measures it (the built-in model on two cores: a player starting
2.0 s after the source plays without a gap). Only a model that runs faster than real time keeps up (the built-in
one does on one core; a released CosyVoice 2 model needs a GPU).

``LiveConversion`` is what a caller holds: ``push`` source samples (any rate, from one thread), ``end``, and iterate
the converted float32 chunks (from another thread, or after ``feed_from`` pushed an iterable in the background).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import soxr
import torch

from cadenza.audio.prompt import DEFAULT_MIN_SECONDS, MAX_PEAK, SILENCE_PEAK
from cadenza.engine.request import SynthesisRequest
from cadenza.errors import AudioError, InputError

TOKEN_SAMPLES = 640  # one 25 Hz speech token at 16 kHz
TOKENIZER_RATE = 16000
LEFT_CONTEXT_TOKENS = 50  # 2 s of the past in every window
LOOKAHEAD_TOKENS = 6  # 0.24 s of the future
STEP_TOKENS = 5  # tokens committed per window: the tokenizer runs 5 times a second of source
MAX_WINDOW_TOKENS = 750  # 30 s: the tokenizer's whisper front end reads no more at once
MIN_RATE, MAX_RATE = 8000, 192000
MAX_CHANNELS = 8


class LiveTokenizer:
    """Speech tokens of a source that arrives in pieces, read in overlapping windows (module docstring).

    ``read``: 16 kHz samples ``[N]`` -> ids ``[1, N // 640]`` (the model's speech tokenizer). Tokens are committed
    ``step`` at a time, each step read in the window from ``left`` tokens before it to ``lookahead`` after it, so the
    ids do not depend on how the source was cut into pieces. ``push`` and ``finish`` return the ids committed by that
    call, in order; together they cover ``N // 640`` tokens of everything pushed.
    """

    def __init__(self, read: Callable[[torch.Tensor], torch.Tensor], left: int = LEFT_CONTEXT_TOKENS,
                 lookahead: int = LOOKAHEAD_TOKENS, step: int = STEP_TOKENS) -> None:
        if min(left, lookahead) < 0 or step < 1 or left + step + lookahead > MAX_WINDOW_TOKENS:
            raise ValueError("bad window: left and lookahead >= 0, step >= 1, and at most 30 s in all")
        self.read, self.left, self.lookahead, self.step = read, left, lookahead, step
        self.committed = 0  # tokens given out so far
        self._buffer = torch.zeros(0)  # the samples from token ``_buffer_start`` on
        self._buffer_start = 0

    @property
    def available(self) -> int:
        """Whole tokens of audio pushed so far."""
        return self._buffer_start + self._buffer.numel() // TOKEN_SAMPLES

    def push(self, wav16k: torch.Tensor) -> list[int]:
        self._buffer = torch.cat([self._buffer, wav16k.reshape(-1).to(torch.float32)])
        ids: list[int] = []
        while self.available >= self.committed + self.step + self.lookahead:
            ids += self._commit(self.committed + self.step)
        return ids

    def finish(self) -> list[int]:
        """The last tokens (the source ended: no more look-ahead to wait for)."""
        ids: list[int] = []
        while self.committed < self.available:
            ids += self._commit(min(self.committed + self.step, self.available))
        return ids

    def _commit(self, end: int) -> list[int]:
        start = max(0, self.committed - self.left)
        stop = min(end + self.lookahead, self.available)
        window = self._buffer[(start - self._buffer_start) * TOKEN_SAMPLES:(stop - self._buffer_start) * TOKEN_SAMPLES]
        ids = self.read(window)[0, self.committed - start:end - start].tolist()
        if len(ids) != end - self.committed:
            raise AudioError(f"the speech tokenizer gave {len(ids)} tokens for {end - self.committed} of source")
        self.committed = end
        keep = max(0, self.committed - self.left)  # the next window starts here at the earliest
        self._buffer = self._buffer[(keep - self._buffer_start) * TOKEN_SAMPLES:]
        self._buffer_start = keep
        return ids


def source_samples(chunk: object, n: int) -> np.ndarray:
    """A pushed piece of source -> float32 ``[samples]``: float samples in [-1, 1] or 16-bit integers, mono
    ``[samples]`` or ``[samples, channels]`` (averaged; a piece may be a single frame, so the axes are never guessed).
    ``n``: its index, for errors."""
    if isinstance(chunk, torch.Tensor):
        chunk = chunk.detach().cpu().numpy()
    if not isinstance(chunk, np.ndarray):
        raise AudioError(f"source piece {n} must be a numpy array or torch tensor of samples, not "
                         f"{type(chunk).__name__}")
    if chunk.dtype == np.int16:
        chunk = chunk.astype(np.float32) / 32768.0
    elif chunk.dtype.kind != "f":
        raise AudioError(f"source piece {n} must hold float or int16 samples, not {chunk.dtype}")
    if chunk.ndim == 2 and 1 <= chunk.shape[1] <= MAX_CHANNELS:  # as sounddevice and soundfile give it
        chunk = chunk.mean(axis=1) if chunk.shape[0] else np.zeros(0, np.float32)
    if chunk.ndim != 1:
        raise AudioError(f"source piece {n} must be [samples] or [samples, channels] (at most {MAX_CHANNELS} "
                         f"channels), got shape {chunk.shape}")
    chunk = chunk.astype(np.float32, copy=False)
    if not np.isfinite(chunk).all():
        raise AudioError(f"source piece {n} contains NaN or infinite samples")
    if chunk.size and float(np.abs(chunk).max()) > MAX_PEAK:
        raise AudioError(f"source piece {n} is not audio: its peak {float(np.abs(chunk).max()):.3g} is beyond any "
                         "sample scale")
    return chunk


def check_rate(sample_rate: object) -> int:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) \
            or not MIN_RATE <= int(sample_rate) <= MAX_RATE:
        raise InputError(f"sample_rate must be an integer from {MIN_RATE} to {MAX_RATE} Hz, got {sample_rate!r}")
    return int(sample_rate)


class LiveConversion:
    """One live conversion (``Cadenza.live_conversion``). ``push``/``end``/``feed_from`` from one producer thread;
    iterate for the converted chunks (float32 at the model's rate, watermarked); ``close`` (or leaving a ``with``
    block) cancels what is left. A bad piece or a source past its bound raises to the producer and ends the
    iteration with the same error."""

    def __init__(self, submit, speech_tokens, mark, request: SynthesisRequest, *, sample_rate: int,
                 max_seconds: float) -> None:
        """submit: the engine's ``submit`` (request, stream) -> handle; speech_tokens: the model's tokenizer;
        request: a ``live_source`` request; max_seconds: the most source this conversion takes."""
        self.sample_rate, self.max_seconds = check_rate(sample_rate), float(max_seconds)
        self._resampler = (None if self.sample_rate == TOKENIZER_RATE else
                           soxr.ResampleStream(self.sample_rate, TOKENIZER_RATE, 1, dtype="float32", quality="VHQ"))
        self._tokens = LiveTokenizer(speech_tokens)
        self._handle = submit(request, stream=True)
        self._chunks = mark.stream(iter(self._handle))
        # Dropped without close() (nothing can push into it any more): its engine slot is freed all the same.
        self._release = weakref.finalize(self, self._handle.cancel)
        self._received, self._peak, self._pieces = 0, 0.0, 0
        self._ended = False
        self._lock = threading.Lock()

    @property
    def seconds_received(self) -> float:
        return self._received / self.sample_rate

    def push(self, samples) -> None:
        """The next source samples at ``sample_rate`` (see ``source_samples``)."""
        with self._lock:
            if self._ended:
                raise InputError("the live source has ended: push before end()")
            try:
                chunk = source_samples(samples, self._pieces)
                self._pieces += 1
                if (self._received + chunk.size) / self.sample_rate > self.max_seconds:
                    raise AudioError(f"the source audio is too long: past {self.max_seconds:g} s, the limit of one "
                                     "live conversion (start a new one)")
                self._received += chunk.size
                if chunk.size:
                    self._peak = max(self._peak, float(np.abs(chunk).max()))
                ids = self._tokens.push(torch.from_numpy(self._at_16k(chunk, last=False)))
            except BaseException as exc:
                self._fail(exc)
                raise
            if ids:
                self._handle.feed_source(ids)

    def end(self) -> None:
        """No more source: the rest is converted and the iteration ends after it."""
        with self._lock:
            if self._ended:
                return
            try:
                ids = self._tokens.push(torch.from_numpy(self._at_16k(np.zeros(0, np.float32), last=True)))
                ids += self._tokens.finish()
                if self.seconds_received < DEFAULT_MIN_SECONDS:
                    raise AudioError(f"the source audio is too short: {self.seconds_received:.2f} s, need at least "
                                     f"{DEFAULT_MIN_SECONDS:g} s")
                if self._peak < SILENCE_PEAK:
                    raise AudioError("the source audio is silent (peak below -60 dBFS): nothing to convert")
            except BaseException as exc:
                self._fail(exc)
                raise
            self._ended = True
            if ids:
                self._handle.feed_source(ids)
            self._handle.end_source()

    def feed_from(self, pieces: Iterable) -> None:
        """Push every piece of ``pieces`` on a thread of its own, then ``end`` (an error ends the iteration with it)."""
        def feed() -> None:
            try:
                for piece in pieces:
                    self.push(piece)
                self.end()
            except BaseException as exc:  # noqa: BLE001 - push/end delivered it to the consumer
                self._fail(exc)

        threading.Thread(target=feed, name="cadenza-live-source", daemon=True).start()

    def _at_16k(self, chunk: np.ndarray, last: bool) -> np.ndarray:
        if self._resampler is None:
            return chunk
        return np.ascontiguousarray(self._resampler.resample_chunk(chunk, last=last), dtype=np.float32)

    def _fail(self, exc: BaseException) -> None:
        if not self._ended:
            self._ended = True
            self._handle.fail(exc if isinstance(exc, Exception) else InputError("the live source was interrupted"))

    def __iter__(self) -> Iterator[np.ndarray]:
        yield from self._chunks  # a generator of its own: whoever iterates keeps the conversion alive

    def cancel(self) -> None:
        """Stop the conversion (any thread): the iteration ends with ``RequestCancelledError``."""
        self._ended = True
        self._release()  # the handle's cancel, once

    def close(self) -> None:
        """``cancel``, and close the iteration (from the consumer's thread)."""
        self.cancel()  # also when the iteration never began (a generator not started has nothing to close)
        self._chunks.close()

    def __enter__(self) -> LiveConversion:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
