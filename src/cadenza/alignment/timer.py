"""Word timestamps while the audio streams: ``WordTimer`` takes the text and the audio chunks as they come and
returns each word's timing once it is settled, so the timings go out with the chunks (SSE ``speech.word`` events,
WebSocket ``word`` messages, ``cadenza synth --timestamps``).

Each alignment run covers the audio from a little before the last settled word's end to the end of what arrived
(``aligner.align_frames`` with a free end), so its cost stays bounded however long the stream. A word is settled when
the path has gone past it, it ends at least ``margin_s`` before the end of the audio so far, and two runs in a row
placed it within ``STABLE_S`` (a free end may rush through the last words to the end of the audio; a span that
more audio does not move is one later audio will not move either); the last words settle at ``finish``. Settled timings are final: the words come out in order, each
starting at or after the previous one's end, all within the audio.
"""

from __future__ import annotations

import math

import numpy as np

from cadenza.alignment.aligner import (
    ALIGN_SR,
    FRAME_SAMPLES,
    STEP_S,
    STEPS_PER_FRAME,
    PhonemePosteriors,
    WordTiming,
    align_frames,
    default_posteriors,
    to_align_rate,
)
from cadenza.alignment.words import Word, spoken_words

FRAME_S = FRAME_SAMPLES / ALIGN_SR
STABLE_S = 0.045  # a word's boundaries moved less than this between two runs: settled
PARSE_CHARS = 2000  # the text is read into words this much at a time, as far ahead as the alignment needs


class WordTimer:
    """One utterance's word timings from its text and its audio at ``sample_rate``, chunk by chunk.

    ``text=None``: the text arrives in pieces too (bi-streaming): ``feed_text`` them, ``end_text`` at the end; a
    word counts once the text after it has a space (or the text ended).
    """

    def __init__(self, text: str | None, sample_rate: int, posteriors: PhonemePosteriors | None = None,
                 language: str = "en-us", margin_s: float = 1.0, context_s: float = 0.0,
                 min_new_s: float = 0.3, max_window_s: float = 20.0) -> None:
        """margin_s: how far before the end of the audio so far a word must end to be settled. context_s: audio
        before the last settled word's end that each run re-reads. min_new_s: audio to wait for between runs.
        max_window_s: past this much unsettled audio the first unsettled word is settled as it stands (bounds the
        classifier's input)."""
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        self.posteriors = posteriors or default_posteriors()
        self.language = language
        self.words: list[Word] = []
        self._text = ""
        self._parsed = 0  # characters of _text already split into words
        self._limit = 0  # characters of _text that may be split into words (complete words only)
        self._text_done = False
        if text is not None:
            self.feed_text(text)
            self.end_text()
        self.sample_rate = sample_rate
        self.margin_s, self.context_s, self.min_new_s = margin_s, context_s, min_new_s
        self.max_window_s = min(max_window_s, self.posteriors.tokenizer.max_seconds - 1.0)
        self._audio: list[np.ndarray] = []  # source-rate samples from _base on
        self._base = 0  # source sample index of _audio's start
        self._n = 0  # samples received
        self._checked = 0  # samples received at the last run
        self._next = 0  # first word not yet returned
        self._floor = 0.0  # end of the last returned word (s)
        self._proposed: dict[int, tuple[float, float]] = {}  # word index -> span of the previous run
        self._finished = False

    def feed_text(self, piece: str) -> None:
        """More of the text (bi-streaming); words complete so far join the alignment."""
        if self._text_done:
            raise ValueError("the text has ended")
        self._text += piece
        self._limit = self._text.rfind(" ") + 1 if not self._text[-1:].isspace() else len(self._text)

    def end_text(self) -> None:
        self._text_done = True
        self._limit = len(self._text)

    def _parse_more(self, everything: bool = False) -> bool:
        """Split the next ``PARSE_CHARS`` of the text (all of it with ``everything``) into words, cut at a space
        outside any tag or leading description; False when nothing is left to split. Lazy because a book's words
        take seconds to phonemise, and its first audio should not wait for them."""
        start, limit = self._parsed, self._limit
        if start >= limit:
            return False
        upto = limit
        if not everything and limit - start > PARSE_CHARS:
            text = self._text
            cut = text.rfind(" ", start, start + PARSE_CHARS)
            while cut > start and (text.count("<", start, cut) != text.count(">", start, cut)
                                   or text.count("(", start, cut) > text.count(")", start, cut)):
                cut = text.rfind(" ", start, cut)
            if cut > start:
                upto = cut + 1
        for word in spoken_words(self._text[start:upto], self.language, description=start == 0):
            self.words.append(Word(word.text, word.start_char + start, word.end_char + start, word.units))
        self._parsed = upto
        return True

    def _reachable(self, steps: int) -> int:
        """How many words from the first unsettled one a run over ``steps`` 20 ms steps can place (each of their
        phonemes holds at least one step), plus one; the text is read into words as far as that needs. A free-end
        run finds the same path with these words as with all the rest: the others are out of its reach."""
        index, k, units = self.posteriors.index, self._next, 0
        while units <= steps and (k < len(self.words) or self._parse_more()):
            if k < len(self.words):  # a slice may hold no word: then read the next
                units += sum(1 for u in self.words[k].units if u in index)
                k += 1
        return k - self._next

    @property
    def duration(self) -> float:
        return self._n / self.sample_rate

    def push(self, chunk: np.ndarray) -> list[WordTiming]:
        """Audio at ``sample_rate`` -> the words settled by it (possibly none)."""
        if self._finished:
            raise ValueError("this WordTimer is finished")
        chunk = np.asarray(chunk, np.float32).reshape(-1)
        if chunk.size:
            self._audio.append(chunk)
            self._n += chunk.size
        if (self._n - self._checked) < self.min_new_s * self.sample_rate:
            return []
        if self._next >= len(self.words) and not self._parse_more():
            return []
        self._checked = self._n
        return self._run(final=False)

    def finish(self) -> list[WordTiming]:
        """Every remaining word (those the audio did not reach end at its end, with no length)."""
        if not self._text_done:
            self.end_text()
        self._finished = True
        self._parse_more(everything=True)
        return self._run(final=True) if self._next < len(self.words) else []

    def _window(self) -> tuple[float, np.ndarray]:
        """(start time, 16 kHz audio) of the next run: from ``context_s`` before the last settled end, on a 40 ms
        frame boundary; earlier audio is dropped."""
        start = max(0.0, math.floor((self._floor - self.context_s) / FRAME_S) * FRAME_S)
        first = int(round(start * self.sample_rate))
        audio = np.concatenate(self._audio) if self._audio else np.zeros(0, np.float32)
        if first > self._base:
            audio = audio[first - self._base:]
            self._audio, self._base = [audio], first
        return self._base / self.sample_rate, to_align_rate(audio, self.sample_rate)

    def _run(self, final: bool) -> list[WordTiming]:
        start, audio = self._window()
        logp = self.posteriors(audio)
        todo = self.words[self._next:] if final else self.words[self._next:self._next + self._reachable(
            len(logp) * STEPS_PER_FRAME)]
        spans, last_state = align_frames(logp, [w.units for w in todo], self.posteriors.index, final=final)
        end_s = self.duration
        settled_before = end_s - self.margin_s
        out: list[WordTiming] = []
        waiting: list[Word] = []  # words without a span, placed once a word after them is
        state = 1  # graph states: a pause, then each word's units and a pause (as aligner._graph)
        base = self._next
        placed = {base + k: (start + span[0] * STEP_S, start + span[1] * STEP_S)
                  for k, span in enumerate(spans) if span is not None}
        previous, self._proposed = self._proposed, placed
        stable = True
        for k, word in enumerate(todo):
            here = placed.get(base + k)
            known = sum(1 for u in word.units if u in self.posteriors.index)
            state += known + 1 if known else 0
            if here is None:
                if known and not final:
                    break
                waiting.append(word)
                continue
            w_start, w_end = here
            before = previous.get(base + k)
            stable = stable and before is not None and max(abs(before[0] - w_start), abs(before[1] - w_end)) < STABLE_S
            if not final and (w_end > settled_before or last_state < state - 1 or not stable):
                break
            out += self._emit(waiting, self._floor, self._floor)
            waiting = []
            out += self._emit([word], w_start, w_end)
        if final:
            out += self._emit(waiting, self._floor, self._floor)
        elif not out and end_s - start > self.max_window_s and self._next < len(self.words):
            # Nothing settles (the audio does not match the text): let the first word go as it stands.
            span = spans[0]
            s, e = (self._floor, self._floor) if span is None else (start + span[0] * STEP_S,
                                                                   start + span[1] * STEP_S)
            out += self._emit([self.words[self._next]], s, e)
        return out

    def _emit(self, words: list[Word], start: float, end: float) -> list[WordTiming]:
        out = []
        for word in words:
            s = min(max(start, self._floor), self.duration)
            e = min(max(end, s), self.duration)
            out.append(WordTiming(word.text, s, e, word.start_char, word.end_char))
            self._floor = e
            self._next += 1
        return out


def align_words(text: str, audio: np.ndarray, sample_rate: int, posteriors: PhonemePosteriors | None = None,
                language: str = "en-us") -> list[WordTiming]:
    """Word timings of a whole utterance (``WordTimer`` over it in 10 s pieces, so any length works)."""
    timer = WordTimer(text, sample_rate, posteriors, language)
    audio = np.asarray(audio, np.float32).reshape(-1)
    piece = 10 * sample_rate
    words = []
    for i in range(0, audio.size, piece):
        words += timer.push(audio[i: i + piece])
    return words + timer.finish()
