"""Speech tokens from a transcript by forced alignment (``cadenza.alignment.speech_labels``): the corpus's unit and
stress rules, Viterbi on posteriors made by hand, and the packaged classifier on the built-in voice."""

import numpy as np
import pytest
import torch

from cadenza.alignment.speech_labels import aligned_labels, label_units
from cadenza.errors import InputError

SYMBOLS = ["_", "^", "$", " ", ",", ".", "a", "b", "c", "ˈ", "ˌ"]
IDX = {s: i for i, s in enumerate(SYMBOLS)}
S = len(SYMBOLS)


def _ids(text: str) -> list[int]:
    return [IDX[c] for c in text]


def test_units_follow_the_corpus_rules():
    """Stress marks are no units and stress the phonemes after them up to a space or punctuation; breaks are
    units of stress 0; ``^`` and ``$`` frame the sentence (recipes/tiny/aligned_corpus.py ``frame_labels``)."""
    units = label_units(_ids("ˈab cˌa,b."), SYMBOLS)
    assert units == [(IDX["^"], 0), (IDX["a"], 1), (IDX["b"], 1), (IDX[" "], 0), (IDX["c"], 0), (IDX["a"], 2),
                     (IDX[","], 0), (IDX["b"], 0), (IDX["."], 0), (IDX["$"], 0)]


def _posteriors(frames: list[str]) -> np.ndarray:
    logp = np.full((len(frames), S), np.log(0.02))
    for t, s in enumerate(frames):
        logp[t, IDX[s]] = np.log(0.8)
    return logp


def test_alignment_places_each_unit_where_its_posteriors_are():
    frames = ["^", "^", "a", "a", "a", "b", " ", "c", "c", "a", ".", ".", "$"]
    labels = aligned_labels(_posteriors(frames), _ids("ˈab ca."), SYMBOLS)
    expect = [IDX["^"]] * 2 + [S + IDX["a"]] * 3 + [S + IDX["b"]] + [IDX[" "]] + [IDX["c"]] * 2 + [IDX["a"]]
    assert labels[:10].tolist() == expect
    # the final pause: "." then "$", split anywhere (pauses are scored alike), each at least one frame
    tail = labels[10:].tolist()
    assert tail[0] == IDX["."] and tail[-1] == IDX["$"] and tail == sorted(tail, key=[IDX["."], IDX["$"]].index)


def test_a_word_space_may_vanish_and_every_other_unit_keeps_a_frame():
    # no pause between the words, and a classifier that hears the wrong phoneme for "b": the order still holds
    frames = ["^", "a", "c", "c", "c", "$"]
    labels = aligned_labels(_posteriors(frames), _ids("ab c"), SYMBOLS)
    assert labels.tolist() == [IDX["^"], IDX["a"], IDX["b"], IDX["c"], IDX["c"], IDX["$"]]
    with pytest.raises(InputError, match="3 frames of 40 ms for 5 phonemes and pauses"):
        aligned_labels(_posteriors(["^", "a", "$"]), _ids("ab c"), SYMBOLS)


def test_the_packaged_classifier_labels_the_builtin_voice_as_it_hears_it(builtin_tts):
    """On the voice it learnt, the aligned labels mostly equal the classifier's own best labels (measured ~0.9),
    and they spell the transcript's units in order."""
    from cadenza.alignment.aligner import PhonemePosteriors
    from cadenza.audio.resample import resample

    text = "We walked to the station together, after lunch."
    frontend = builtin_tts.engine.frontend
    audio = builtin_tts.synthesize(text, seed=0)
    wav16k = resample(torch.from_numpy(audio.samples), audio.sample_rate, 16000)
    posteriors = PhonemePosteriors()
    ids = frontend.text_ids(text)[0].tolist()
    labels = aligned_labels(posteriors(wav16k.numpy()), ids, posteriors.symbols)
    own = frontend.speech_tokens(wav16k)[0].numpy()
    n = min(len(labels), len(own))
    assert abs(len(labels) - len(own)) <= 1
    assert (labels[:n] == own[:n]).mean() > 0.8
    space = posteriors.symbols.index(" ")

    def spelt(seq):  # without word spaces (they may vanish), equal neighbours as one
        seq = [int(v) for v in seq if v != space]
        return [v for i, v in enumerate(seq) if i == 0 or v != seq[i - 1]]

    units = [stress * len(posteriors.symbols) + sym for sym, stress in label_units(ids, posteriors.symbols)]
    assert spelt(labels) == spelt(units)  # every unit, in order
