"""Word timestamps: the word split, the Viterbi on posteriors made by hand, and the packaged aligner on speech whose
word boundaries are known exactly (the built-in model's words rendered one by one and joined with silences)."""

import numpy as np
import pytest

from cadenza.alignment.aligner import STEP_S, align_frames
from cadenza.alignment.timer import WordTimer, align_words
from cadenza.alignment.words import spoken_words


def test_words_are_the_written_ones_with_their_spoken_phonemes():
    words = spoken_words("(A calm voice)Hello [laughter] there, $5 <strong>friends</strong> -- ok.")
    assert [w.text for w in words] == ["Hello", "there,", "$5", "friends", "ok."]
    assert [(w.start_char, w.end_char) for w in words][:2] == [(14, 19), (31, 37)]
    assert "".join(words[0].units) == "həloʊ" and len(words[2].units) > len("faɪv")  # "five dollars"


def test_viterbi_places_units_where_their_posteriors_are():
    index = {s: i for i, s in enumerate(["_", "^", "$", " ", "a", "b", "c"])}
    # 40 ms frames: pause x2, a x3, pause x2, b x2, c x4, pause x1
    frames = ["_", "_", "a", "a", "a", " ", " ", "b", "b", "c", "c", "c", "c", "_"]
    logp = np.full((len(frames), len(index)), np.log(0.01))
    for t, s in enumerate(frames):
        logp[t, index[s]] = np.log(0.9)
    spans, last = align_frames(logp, [("a",), ("b", "c")], index)
    assert spans == [(4, 10), (14, 26)]  # in 20 ms steps
    assert [s * STEP_S for s in spans[1]] == pytest.approx([0.28, 0.52])
    # audio still arriving: the path may end inside the second word, and says where it got to
    partial, last = align_frames(logp[:9], [("a",), ("b", "c")], index, final=False)
    assert partial[0] == (4, 10) and last < 6


@pytest.fixture(scope="module")
def tts(builtin_tts):
    return builtin_tts


@pytest.fixture(scope="module")
def joined(tts):
    """Three words rendered alone and joined by known silences: (text, audio, [(start, end)] of each rendering)."""
    sr, pieces, spans, t = tts.sample_rate, [], [], 0.0
    for k, word in enumerate(["Morning", "coffee", "tastes", "wonderful"]):
        audio = tts.synthesize(word + ".", seed=k).samples
        gap = np.zeros(int((0.25 + 0.1 * k) * sr), np.float32)
        pieces += [gap, audio]
        t += gap.size / sr
        spans.append((t, t + audio.size / sr))
        t += audio.size / sr
    return "Morning coffee tastes wonderful.", np.concatenate(pieces + [np.zeros(sr // 4, np.float32)]), spans


def _speech_span(audio: np.ndarray, sr: int, span) -> tuple[float, float]:
    """Where a word's rendering actually sounds (its own leading/trailing silence cut off)."""
    a, b = int(span[0] * sr), int(span[1] * sr)
    frame = sr // 100
    env = np.sqrt(np.convolve(audio[a:b] ** 2, np.ones(frame) / frame, "same"))
    loud = np.nonzero(env > 0.02 * env.max())[0]  # -34 dB: a weak final consonant still counts
    return span[0] + loud[0] / sr, span[0] + loud[-1] / sr


def test_aligner_finds_known_word_boundaries_whole_and_streamed(tts, joined):
    text, audio, spans = joined
    sr = tts.sample_rate
    truth = [_speech_span(audio, sr, s) for s in spans]
    whole = align_words(text, audio, sr)
    assert [w.word for w in whole] == text.split()
    errors = [abs(w.start - t[0]) for w, t in zip(whole, truth)] + [abs(w.end - t[1]) for w, t in zip(whole, truth)]
    assert np.median(errors) <= 0.05 and max(errors) <= 0.15, (whole, truth)
    timer, streamed, at = WordTimer(text, sr), [], []
    for i in range(0, audio.size, sr // 2):
        got = timer.push(audio[i: i + sr // 2])
        streamed += got
        at += [(i + sr // 2) / sr] * len(got)
    streamed += timer.finish()
    assert [w.word for w in streamed] == text.split()
    # monotone, within the audio, each word out only once its audio has arrived
    ends = [0.0] + [w.end for w in streamed]
    assert all(ends[k] <= w.start <= w.end for k, w in enumerate(streamed)) and ends[-1] <= audio.size / sr
    assert all(w.end <= t for w, t in zip(streamed, at)) and len(at) >= 2  # some words settle before the end
    assert max(abs(a.start - b.start) + abs(a.end - b.end) for a, b in zip(streamed, whole)) <= 0.1


def test_a_long_text_is_read_into_words_as_the_audio_needs_them_with_the_same_timings(tts, monkeypatch):
    """``WordTimer`` splits a long text into words a little at a time and aligns each streaming run with the words
    it can reach (a phoneme holds at least one 20 ms step): the timings are those of splitting it all first and
    aligning every run with every remaining word, and far fewer words are read before the first settle."""
    import cadenza.alignment.timer as timer_module

    sentences = ["The man walked to the house in the evening.", "Please close the window before you leave.",
                 "My brother finally fixed the squeaky door.", "We decided to stay home and watch a film."]
    spoken = " ".join(sentences * 2)
    audio = tts.synthesize(spoken, seed=2)
    text = spoken + " " + " ".join(sentences * 400)  # a book of which the audio is only the start

    def run(timer):
        out, piece = [], audio.sample_rate // 2
        for i in range(0, audio.samples.size, piece):
            out += timer.push(audio.samples[i: i + piece])
        return out

    lazy = WordTimer(text, audio.sample_rate)
    assert lazy._parsed < len(text) // 10  # nothing beyond the first slice is read yet
    got = run(lazy)
    assert lazy._parsed < len(text) // 10 and len(got) >= 40  # the words of 8 sentences, read as far as needed
    monkeypatch.setattr(timer_module, "PARSE_CHARS", 10**9)
    monkeypatch.setattr(WordTimer, "_reachable", lambda self, steps: len(self.words) - self._next)
    eager = WordTimer(text, audio.sample_rate)
    assert [(w.word, w.start, w.end) for w in run(eager)] == [(w.word, w.start, w.end) for w in got]
