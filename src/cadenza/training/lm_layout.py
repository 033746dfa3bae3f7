"""Teacher-forcing sequences of the text-speech LM and their padded batch.

See docs/design.md, "CosyVoice 2 LM sequence layouts".

A sequence is a list of positions, each a *kind* (sos / task_id marker, text id, speech id) with an id, and a
target (the id the position must predict, or ``IGNORE_ID``). Two layouts:

* unistream ``[sos, text, task_id, speech]`` -> targets ``[-1 x (1 + T_text)] + speech + [eos]``;
* bistream (N:M = ``mix_ratio``, 5:15): ``[sos]`` then for each full chunk of N text tokens: the N text tokens and the
  next M speech tokens, with targets ``[-1 x (N-1)] + M speech tokens + [fill]``; the remainder (possibly empty) of
  the text, ``task_id`` and the remaining speech with targets ``[-1 x len(rest)] + rest speech + [eos]``.

Bistream is only possible if every full text chunk has M speech tokens to go with it, i.e. when
``T_speech / T_text > M / N`` (the reference's condition); the stage picks it with probability ``mix_probability``.
The loss sees speech, eos and fill targets only — the same positions the model predicts at inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

IGNORE_ID = -1
PAD, SOS, TEXT, TASK_ID, SPEECH = -1, 0, 1, 2, 3  # position kinds


@dataclass(frozen=True)
class LMSequence:
    kinds: list[int]
    ids: list[int]
    targets: list[int]

    def __post_init__(self) -> None:
        if not len(self.kinds) == len(self.ids) == len(self.targets):
            raise ValueError("kinds, ids and targets must have the same length")

    def __len__(self) -> int:
        return len(self.kinds)


def can_bistream(n_text: int, n_speech: int, mix_ratio: tuple[int, int]) -> bool:
    n, m = mix_ratio
    return n_text > 0 and n_speech * n > m * n_text


def unistream(text: Sequence[int], speech: Sequence[int], eos_id: int) -> LMSequence:
    t, s = list(text), list(speech)
    kinds = [SOS] + [TEXT] * len(t) + [TASK_ID] + [SPEECH] * len(s)
    ids = [0] + t + [0] + s
    targets = [IGNORE_ID] * (1 + len(t)) + s + [eos_id]
    return LMSequence(kinds, ids, targets)


def bistream(text: Sequence[int], speech: Sequence[int], mix_ratio: tuple[int, int], eos_id: int, fill_id: int) -> LMSequence:
    n, m = mix_ratio
    t, s = list(text), list(speech)
    if not can_bistream(len(t), len(s), mix_ratio):
        raise ValueError(f"bistream needs more than {m}/{n} speech tokens per text token ({len(s)} for {len(t)})")
    kinds, ids, targets = [SOS], [0], [IGNORE_ID]
    n_chunks = (len(t) + 1 + n - 1) // n  # ceil((T_text + 1) / N): the last chunk is always the remainder
    for j in range(n_chunks):
        tc, sc = t[j * n : (j + 1) * n], s[j * m : (j + 1) * m]
        if len(tc) == n:
            kinds += [TEXT] * n + [SPEECH] * m
            ids += tc + sc
            targets += [IGNORE_ID] * (n - 1) + sc + [fill_id]
        else:
            rest = s[j * m :]
            kinds += [TEXT] * len(tc) + [TASK_ID] + [SPEECH] * len(rest)
            ids += tc + [0] + rest
            targets += [IGNORE_ID] * len(tc) + rest + [eos_id]
    return LMSequence(kinds, ids, targets)


def build_sequence(text: Sequence[int], speech: Sequence[int], mix_ratio: tuple[int, int], eos_id: int, fill_id: int,
                   mix_probability: float, draw: float) -> LMSequence:
    """Bistream when ``draw < mix_probability`` and the lengths allow it, else unistream (``draw`` ~ U[0, 1))."""
    if draw < mix_probability and can_bistream(len(text), len(speech), mix_ratio):
        return bistream(text, speech, mix_ratio, eos_id, fill_id)
    return unistream(text, speech, eos_id)


@dataclass
class LMBatch:
    """Right-padded sequences: kinds / ids / targets ``[B, L]`` (long), lengths ``[B]``."""

    kinds: torch.Tensor
    ids: torch.Tensor
    targets: torch.Tensor
    lengths: torch.Tensor

    def to(self, device: torch.device) -> LMBatch:
        return LMBatch(*(t.to(device, non_blocking=True) for t in (self.kinds, self.ids, self.targets, self.lengths)))


def pad_sequences(seqs: Sequence[LMSequence]) -> LMBatch:
    length = max(len(s) for s in seqs)
    b = len(seqs)
    kinds = torch.full((b, length), PAD, dtype=torch.long)
    ids = torch.zeros(b, length, dtype=torch.long)
    targets = torch.full((b, length), IGNORE_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        kinds[i, : len(s)] = torch.tensor(s.kinds)
        ids[i, : len(s)] = torch.tensor(s.ids)
        targets[i, : len(s)] = torch.tensor(s.targets)
    return LMBatch(kinds, ids, targets, torch.tensor([len(s) for s in seqs]))
