"""Token samplers of the CosyVoice 2 LM: repetition-aware sampling (RAS), nucleus, greedy.

RAS: docs/design.md, "RAS sampling".

All randomness goes through an explicit ``torch.Generator`` (``None`` = torch's global CPU generator). A
generator created with ``torch.Generator().manual_seed(s)`` produces the same draws as the reference run after
``torch.manual_seed(s)``, provided the calls are the same: one ``multinomial`` per step, plus one more when the
repetition rule fires. Nothing here reseeds any global RNG.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from cadenza.models.cosyvoice2.config import SamplingConfig


def greedy(logp: torch.Tensor) -> int:
    """Index of the largest score of ``logp [V]``."""
    return int(torch.argmax(logp).item())


def nucleus_sampling(
    logp: torch.Tensor, top_p: float, top_k: int, generator: torch.Generator | None = None
) -> int:
    """Draw from the smallest top-probability set reaching ``top_p`` (at most ``top_k`` entries).

    logp ``[V]``: scores (log-probabilities; -inf entries have probability 0). Probabilities are sorted descending
    with a stable sort (ties keep index order); entries are taken while ``cumulative < top_p and count < top_k``,
    so the entry that crosses ``top_p`` is included. The cumulative sum is accumulated in float32 one entry at a
    time like the reference (torch's ``cumsum`` accumulates in double on CPU and could flip the boundary entry).
    One index is drawn with ``multinomial`` on the *unnormalised* selected probabilities.
    """
    head, order = top_probabilities(logp.softmax(dim=0), top_k)
    count = nucleus_size(head, top_p)
    pick = torch.multinomial(head[:count], 1, replacement=True, generator=generator)
    return int(order[pick].item())


def top_probabilities(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` entries of ``probs [V]`` sorted descending with a stable sort: (values [k], indices [k]).

    ``topk`` of ``k + 1`` finds them without sorting all V (6,564 speech ids: ~0.6 ms a step for the full sort).
    Its order among equal values is unspecified, so the k are re-sorted stably by index then value; when the k-th
    value ties with the next, which of the tied ids are in the first k depends on the stable order of the whole
    array, and the full sort decides."""
    k = min(k, probs.numel())
    if 0 < k < probs.numel():
        values, index = probs.topk(k + 1)
        if bool(values[k - 1] > values[k]):
            values, index = values[:k], index[:k]
            by_index = index.argsort()
            values, index = values[by_index], index[by_index]
            by_value = values.sort(descending=True, stable=True).indices
            return values[by_value], index[by_value]
    values, index = probs.sort(descending=True, stable=True)
    return values[:k], index[:k]


def nucleus_size(head: torch.Tensor, top_p: float) -> int:
    """How many of the sorted probabilities ``head [K]`` the nucleus takes: the first always, then entry ``i`` while
    the sum of the entries before it is below ``top_p`` — summed one entry at a time in ``head``'s dtype and compared
    in it, as the reference's loop does. ``np.cumsum`` adds in order in the array's dtype, so it gives the same sums
    without a Python step per entry; bfloat16 (no NumPy type) takes the loop."""
    if head.dtype == torch.bfloat16:
        cum, count = torch.zeros((), dtype=head.dtype, device=head.device), 0
        for value in head:
            if count > 0 and not bool(cum < top_p):
                break
            cum, count = cum + value, count + 1
        return count
    values = head.detach().cpu().numpy()
    running = np.cumsum(values, dtype=values.dtype)[:-1]  # running[i - 1]: the sum of the entries before entry i
    stops = np.flatnonzero(running >= values.dtype.type(top_p))
    return 1 + (int(stops[0]) if stops.size else running.size)


def random_sampling(logp: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """Draw one index from the full distribution ``softmax(logp)``."""
    return int(torch.multinomial(logp.softmax(dim=0), 1, replacement=True, generator=generator).item())


def ras_sampling(
    logp: torch.Tensor,
    history: Sequence[int] | torch.Tensor,
    cfg: SamplingConfig,
    generator: torch.Generator | None = None,
) -> int:
    """Repetition-aware sampling (docs/design.md, "RAS sampling").

    logp ``[V]``; history: ids generated so far for this utterance (prompt tokens excluded). A nucleus draw is
    made; if that id occurs in the last ``win_size`` outputs at least ``win_size * tau_r`` times, ``logp[id]`` is
    set to -inf **in place** (as the reference does; callers that reuse ``logp`` must pass a copy) and one id is
    drawn from the full ``softmax(logp)`` instead (no top-p/top-k).
    """
    top_id = nucleus_sampling(logp, cfg.top_p, cfg.top_k, generator)
    recent = history[-cfg.win_size :] if len(history) else []
    recent = recent.tolist() if isinstance(recent, torch.Tensor) else list(recent)
    repeats = sum(1 for t in recent if int(t) == top_id)
    if repeats >= cfg.win_size * cfg.tau_r:
        logp[top_id] = -float("inf")
        top_id = random_sampling(logp, generator)
    return top_id


class RasSampler:
    """``(logp [V], history) -> id`` callable bound to a sampling config and a generator (the LM's default)."""

    def __init__(self, cfg: SamplingConfig, generator: torch.Generator | None = None) -> None:
        self.cfg = cfg
        self.generator = generator

    def __call__(self, logp: torch.Tensor, history: Sequence[int]) -> int:
        return ras_sampling(logp, history, self.cfg, self.generator)


class GreedySampler:
    """``(logp [V], history) -> argmax``; deterministic decoding."""

    def __call__(self, logp: torch.Tensor, history: Sequence[int]) -> int:
        return greedy(logp)
