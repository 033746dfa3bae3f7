"""Word timestamps by forced alignment: the built-in frame classifier's phoneme posteriors + Viterbi.

The acoustic model is cadenza-tiny's speech tokenizer (``speech_tokenizer.safetensors`` in the packaged model, 2 M
parameters): a classifier that labels every 40 ms of 16 kHz audio with the phoneme (x stress) spoken then, trained
on the teacher's own phoneme timings (docs/cadenza-tiny.md). It ships with the package, so timestamps need nothing
else and work for audio of any model; it was trained on one English voice, so it is most accurate on the built-in
model's voice and English text (measured accuracy: docs/controls.md, "Word timestamps").

Alignment: the words' phoneme units (``words.py``) in order, an optional pause state between words and at both ends,
each unit at least one step; the posteriors (stress summed out) are read at 20 ms steps (each 40 ms frame twice, so
fast speech still has a step for every unit); Viterbi finds the best path. ``align_frames(..., final=False)`` lets
the path end anywhere (audio still arriving: ``StreamingWordTimer``).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cadenza.audio.resample import resample
from cadenza.audio.whisper_mel import whisper_log_mel

ALIGN_SR = 16000
FRAME_SAMPLES = 640  # one classifier frame (40 ms at 16 kHz)
STEPS_PER_FRAME = 2  # alignment steps of 20 ms
STEP_S = FRAME_SAMPLES / ALIGN_SR / STEPS_PER_FRAME
_PAUSE_SYMBOLS = ("_", "^", "$", " ", ",", ".", "!", "?", ";", ":")
_NEG = -1e9


@dataclass(frozen=True)
class WordTiming:
    """One input word and where it is spoken: ``start`` / ``end`` in seconds from the start of the audio."""

    word: str
    start: float
    end: float
    start_char: int = 0  # the word's span in the input text
    end_char: int = 0

    def to_dict(self) -> dict:
        return {"word": self.word, "start": round(self.start, 3), "end": round(self.end, 3),
                "start_char": self.start_char, "end_char": self.end_char}


class PhonemePosteriors:
    """Audio -> log-probabilities of each phoneme symbol per 40 ms frame ``[frames, symbols]`` (stress summed)."""

    def __init__(self, model_dir: Path | None = None) -> None:
        from cadenza.builtin import builtin_model_dir
        from cadenza.models.speech_tokenizer.inference import load_speech_tokenizer
        from cadenza.text.phonemes import PHONEMES_FILE, PhonemeTable

        folder = Path(model_dir) if model_dir is not None else builtin_model_dir()
        self.tokenizer = load_speech_tokenizer(folder)
        self.table = PhonemeTable.read(folder / "CosyVoice-BlankEN" / PHONEMES_FILE)
        self.symbols = self.table.symbols
        self.index = {s: i for i, s in enumerate(self.symbols)}
        classes = self.tokenizer.config.frame_classes
        if not classes or classes % len(self.symbols):
            raise ValueError(f"{folder}: the speech tokenizer is no phoneme frame classifier "
                             f"({classes} classes for {len(self.symbols)} symbols)")
        self.max_frames = int(self.tokenizer.max_seconds * ALIGN_SR) // FRAME_SAMPLES
        self._lock = threading.Lock()

    @torch.no_grad()
    def __call__(self, audio16k: np.ndarray) -> np.ndarray:
        """float mono 16 kHz samples -> float32 ``[len // 640, symbols]`` log-probabilities (no frame: ``[0, S]``)."""
        n = audio16k.size // FRAME_SAMPLES
        if n == 0:
            return np.zeros((0, len(self.symbols)), np.float32)
        wav = torch.from_numpy(np.ascontiguousarray(audio16k[: n * FRAME_SAMPLES], dtype=np.float32))
        mel = whisper_log_mel(wav, self.tokenizer.config.n_mels)[:, :, : n * 4]
        model = self.tokenizer.model
        with self._lock:  # one classifier call at a time: its intra-op threads are shared anyway
            hidden, _ = model.encode(mel)
            logp = torch.log_softmax(model.frame_logits(hidden)[0].float(), dim=-1)
        by_stress = logp.view(logp.size(0), -1, len(self.symbols))
        return torch.logsumexp(by_stress, dim=1)[:n].numpy()


@functools.lru_cache(maxsize=1)
def default_posteriors() -> PhonemePosteriors:
    """The packaged classifier, loaded once per process."""
    return PhonemePosteriors()


def to_align_rate(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    audio = np.asarray(audio, np.float32).reshape(-1)
    if sample_rate == ALIGN_SR:
        return audio
    return resample(torch.from_numpy(audio), sample_rate, ALIGN_SR).numpy()


@dataclass
class _Graph:
    """The left-to-right states: unit symbol ids (``-1``: a pause state), optional flags, and each word's states."""

    symbols: np.ndarray  # [N] int
    optional: np.ndarray  # [N] bool
    word_states: list[tuple[int, int]]  # per word: [first, last] state, (-1, -1) for a word without units


def _graph(words: list[tuple[str, ...]], index: dict[str, int]) -> _Graph:
    symbols, optional, spans = [-1], [True], []
    for units in words:
        ids = [index[u] for u in units if u in index]
        if not ids:
            spans.append((-1, -1))
            continue
        first = len(symbols)
        symbols += ids
        optional += [False] * len(ids)
        spans.append((first, len(symbols) - 1))
        symbols.append(-1)
        optional.append(True)
    return _Graph(np.array(symbols), np.array(optional), spans)


def _emissions(logp: np.ndarray, graph: _Graph, index: dict[str, int]) -> np.ndarray:
    """``[steps, N]`` log-likelihood of each state per 20 ms step."""
    pause_ids = [index[s] for s in _PAUSE_SYMBOLS if s in index]
    pause = np.logaddexp.reduce(logp[:, pause_ids], axis=1) if pause_ids else np.full(len(logp), _NEG)
    cols = np.where(graph.symbols[None, :] >= 0, logp[:, np.maximum(graph.symbols, 0)], pause[:, None])
    return np.repeat(cols, STEPS_PER_FRAME, axis=0)


def viterbi(emit: np.ndarray, optional: np.ndarray, final: bool) -> np.ndarray:
    """Best left-to-right path: the state of every step ``[T]`` (each state held >= 1 step; optional ones may be
    skipped). ``final``: the path must reach the last non-optional state."""
    steps, n = emit.shape
    score = np.full(n, _NEG)
    score[0] = emit[0, 0]
    if n > 1 and optional[0]:
        score[1] = emit[0, 1]
    back = np.zeros((steps, n), np.int32)
    idx = np.arange(n)
    skip_ok = np.zeros(n, bool)
    skip_ok[2:] = optional[1:-1]  # i-2 -> i when i-1 is optional
    for t in range(1, steps):
        stay = score
        move = np.concatenate([[_NEG], score[:-1]])
        jump = np.where(skip_ok, np.concatenate([[_NEG, _NEG], score[:-2]]), _NEG)
        best = np.maximum(np.maximum(stay, move), jump)
        back[t] = np.where(best == stay, idx, np.where(best == move, idx - 1, idx - 2))
        score = best + emit[t]
    if final:
        ends = [n - 1] + ([n - 2] if n > 1 and optional[n - 1] else [])
        state = max(ends, key=lambda s: score[s])
    else:
        state = int(np.argmax(score))
    path = np.empty(steps, np.int64)
    for t in range(steps - 1, -1, -1):
        path[t] = state
        state = back[t, state]
    return path


def align_frames(logp: np.ndarray, words: list[tuple[str, ...]], index: dict[str, int], final: bool = True
                 ) -> tuple[list[tuple[int, int] | None], int]:
    """Word spans in 20 ms steps ``[start, end)`` (``None`` for a word the path did not reach, or without units)
    and the last state the path reached (for streaming: how far the words are certain)."""
    graph = _graph(words, index)
    if len(logp) == 0:
        return [None] * len(words), 0
    emit = _emissions(logp, graph, index)
    path = viterbi(emit, graph.optional, final)
    first_step = np.full(len(graph.symbols), -1)
    last_step = np.full(len(graph.symbols), -1)
    for t, s in enumerate(path):
        if first_step[s] < 0:
            first_step[s] = t
        last_step[s] = t
    spans = []
    for first, last in graph.word_states:
        if first < 0 or first_step[last] < 0:
            spans.append(None)
        else:
            spans.append((int(first_step[first]), int(last_step[last]) + 1))
    return spans, int(path[-1])


def fill_gaps(spans: list[tuple[float, float] | None], total: float) -> list[tuple[float, float]]:
    """Words the alignment could not place (no phonemes) get an empty span where they fall between placed ones."""
    out, prev_end = [], 0.0
    for i, span in enumerate(spans):
        if span is None:
            nxt = next((s[0] for s in spans[i + 1:] if s is not None), total)
            out.append((prev_end, max(prev_end, min(nxt, prev_end))))
        else:
            start = max(span[0], prev_end)
            out.append((start, max(start, span[1])))
            prev_end = out[-1][1]
    return out
