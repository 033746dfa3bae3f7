"""Seeds and RNG state: deterministic per-rank seeding, save/restore for resume, per-item random streams.

Stages draw their per-utterance random choices (bistream or not, prompt length, mask type, flow time and noise)
from ``item_generator(seed, step, index)``: a stream that depends only on the run seed, the step and the item's
dataset index. The draws then do not depend on which rank holds the item, on the batch composition or on how
often the run was resumed — which is what makes ``--resume`` and N-process runs reproduce a single run.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def item_seed(seed: int, step: int, index: int, salt: int = 0) -> int:
    """A well-mixed 63-bit seed for (run seed, step, dataset index, salt)."""
    state = np.random.SeedSequence([seed % 2**63, step, index, salt]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


def item_generator(seed: int, step: int, index: int, salt: int = 0) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from ``item_seed``."""
    return torch.Generator().manual_seed(item_seed(seed, step, index, salt))


def rng_state() -> dict[str, Any]:
    """Global RNG states as tensors and plain data (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": int(version), "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
