"""What the stages that train a CTC head over characters share (the speech tokenizer's ASR half, the token
reader): best-path decoding and the checkpoint of model + optimiser + character vocabulary."""

from __future__ import annotations

import math
from typing import Any

import torch

from cadenza.errors import InputError
from cadenza.models.speech_tokenizer.char_vocab import BLANK, CharVocab


def ctc_greedy(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best-path decoding: argmax per frame, repeats merged, blanks dropped. ``[B, T, V]`` -> label id lists."""
    best = log_probs.argmax(-1).cpu()
    out = []
    for b in range(best.shape[0]):
        seq = torch.unique_consecutive(best[b, : int(lengths[b])]).tolist()
        out.append([i for i in seq if i != BLANK])
    return out


def json_metrics(metrics: dict[str, float]) -> dict[str, float | None]:
    """Metrics for a JSON header: NaN (nothing held out) as null."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}


class CharVocabCheckpoint:
    """``state_dict`` / ``load_state_dict`` of a stage with ``model``, ``opt`` and a ``vocab`` built from its data:
    a checkpoint made on other data (another character vocabulary) is refused."""

    model: torch.nn.Module
    opt: torch.optim.Optimizer
    vocab: CharVocab

    def state_dict(self) -> dict[str, Any]:
        return {"model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                "optim": self.opt.state_dict(), "vocab": self.vocab.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if CharVocab.from_dict(state["vocab"]).to_dict() != self.vocab.to_dict():
            raise InputError("the checkpoint's character vocabulary differs from the one built from this data")
        self.model.load_state_dict(state["model"], strict=True)
        self.opt.load_state_dict(state["optim"])
