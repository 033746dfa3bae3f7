"""Speech tokens of a recording from its transcript: the phoneme frame classifier's labels, placed by forced alignment.

cadenza-tiny's speech tokens are labels, one per 40 ms frame: the phoneme spoken then, with its stress
(``stress * S + symbol``, S = the phoneme table's size; docs/cadenza-tiny.md). Its training corpus took them from
the teacher's own phoneme timings (``recipes/tiny/aligned_corpus.py``). For a new voice there are no timings, and
the classifier's own best label per frame is poor: it learnt one voice (voice conversion from a voice it never
heard keeps ~10 % of the words: docs/training.md, "Your voice on the built-in model"). Where the transcript is known
(a training corpus), the label sequence is known too and only its boundaries are missing: this module reads them
from the classifier's posteriors with Viterbi, so every frame gets a label of the right phoneme in the right order.

The units and their labels follow the corpus's rule exactly: ``^`` (the start), then each phoneme of the text ids
(stress marks set the stress of the phonemes after them up to the next word space or punctuation, which resets it
and is a unit of its own, stress 0), then ``$`` (the end). Every unit holds at least one frame, except word spaces,
which may vanish. Pauses (``^ $ , . ! ? ; :`` and spaces) are scored by the classifier's total pause probability,
phonemes by their own (stress summed out): the boundaries do not depend on the classifier telling stress levels or
one pause from another apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cadenza.alignment.aligner import viterbi
from cadenza.errors import InputError

STRESS = {"ˈ": 1, "ˌ": 2}  # the corpus's stress marks and their stress levels
BREAKS = frozenset(" ,.;:!?^$")  # a stress region ends at a word space, punctuation or the ends
_PAUSES = (" ", ",", ".", ";", ":", "!", "?", "^", "$", "_")


def label_units(text_ids: Sequence[int], symbols: Sequence[str]) -> list[tuple[int, int]]:
    """``(symbol index, stress)`` units of a phoneme id sequence, with ``^`` first and ``$`` last."""
    index = {s: i for i, s in enumerate(symbols)}
    units, stress = [(index["^"], 0)], 0
    for i in text_ids:
        sym = symbols[int(i)]
        if sym in STRESS:
            stress = STRESS[sym]
            continue
        if sym in BREAKS:
            stress = 0
        units.append((index[sym], 0 if sym in BREAKS else stress))
    units.append((index["$"], 0))
    return units


def aligned_labels(logp: np.ndarray, text_ids: Sequence[int], symbols: Sequence[str]) -> np.ndarray:
    """Frame log-posteriors ``[frames, S]`` (stress summed out: ``PhonemePosteriors``) and the transcript's phoneme
    ids -> int64 labels ``[frames]`` (``stress * S + symbol``). Raises ``InputError`` when the recording has fewer
    frames than the transcript has units (it cannot say them all: a wrong transcript, or cut audio)."""
    units = label_units(text_ids, symbols)
    n_symbols = len(symbols)
    space = symbols.index(" ")
    optional = np.array([sym == space for sym, _ in units])
    needed = int((~optional).sum())
    if len(logp) < needed:
        raise InputError(f"the recording has {len(logp)} frames of 40 ms for {needed} phonemes and pauses of its "
                         "transcript: a transcript that does not match, or cut audio")
    pause_ids = [symbols.index(s) for s in _PAUSES if s in symbols]
    pause = np.logaddexp.reduce(logp[:, pause_ids], axis=1)
    cols = [pause if symbols[sym] in BREAKS else logp[:, sym] for sym, _ in units]
    emit = np.stack(cols, axis=1)
    # A word space between two states is skipped by the path's jump; one at either end has a neighbour pause.
    path = viterbi(emit, optional, final=True)
    labels = np.array([stress * n_symbols + sym for sym, stress in units], np.int64)
    return labels[path]
