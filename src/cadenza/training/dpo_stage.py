"""Stage ``dpo``: direct preference optimisation of the LM on (chosen, rejected) speech for the same text.

See docs/training.md, "Stage dpo".

Loss per pair: ``-logsigmoid(beta * ((pi_c - pi_r) - (ref_c - ref_r)))`` with ``pi`` / ``ref`` the policy's / the
frozen reference model's per-sequence log-probability of the speech targets, plus ``sft_weight`` x the usual
cross-entropy on the chosen sequence (the reference adds it with weight 1). The reference model is the policy as
it was at the start (``init_llm``); it stays frozen and is saved in checkpoints.

Per-sequence log-prob: the **mean** over the scored positions (speech, eos, fill) — the reference computes a mean
too, but over the wrong positions (see ``lm_model.sequence_log_probs``). ``average_log_probs: false`` sums instead.

Config (``dpo:`` section; also every ``lm:`` key, with ``mix_probability`` defaulting to 0 — and when > 0 the
chosen and rejected sequences of a pair share the layout draw)::

    dpo:
      pairs: preference_pairs.jsonl     # relative to the data folder (format: dpo_pairs.py)
      beta: 0.01
      sft_weight: 1.0
      average_log_probs: true
      init_llm: /path/to/llm.pt          # the LM to tune (also the frozen reference)
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from cadenza.errors import InputError
from cadenza.training.distributed import global_mean_count
from cadenza.training.dpo_pairs import read_pairs
from cadenza.training.lm_model import LMForTraining, sequence_log_probs, targets_of
from cadenza.training.lm_stage import LMStageBase, LMStageConfig
from cadenza.training.seeding import item_generator
from cadenza.training.stage import Wrap, register

log = logging.getLogger(__name__)
SALT_DPO = 2


@dataclass(frozen=True)
class DPOStageConfig(LMStageConfig):
    mix_probability: float = 0.0
    pairs: str = "preference_pairs.jsonl"
    beta: float = 0.01
    sft_weight: float = 1.0
    average_log_probs: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta <= 0 or self.sft_weight < 0:
            raise InputError("dpo: beta must be > 0 and sft_weight >= 0")


class PairItems(Dataset):
    def __init__(self, path: Path, tokenizer) -> None:
        pairs = read_pairs(path)
        if tokenizer is None and any("text_ids" not in p for p in pairs):
            raise InputError(f"{path}: pairs given as text need the tokenizer (model.tokenizer or model.dir)")
        self.pairs, self.tokenizer = pairs, tokenizer

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        p = self.pairs[i]
        text_ids = p["text_ids"] if "text_ids" in p else self.tokenizer.encode(p["text"])
        return {"index": i, "id": p["id"], "speaker": p["speaker"], "text_ids": text_ids, "text": p.get("text", ""),
                "chosen": p["chosen"], "rejected": p["rejected"]}


@register
class DPOStage(LMStageBase):
    name = "dpo"
    section = "dpo"
    config_class = DPOStageConfig

    def setup(self, device: torch.device, wrap: Wrap) -> None:
        if not self.cfg.init_llm:
            log.warning("dpo without init_llm: the policy and the reference start from random weights")
        super().setup(device, wrap)
        self.ref = LMForTraining(copy.deepcopy(self.lm)).eval().requires_grad_(False)

    def dataset(self) -> Dataset:
        return PairItems(self.data_dir / self.cfg.pairs, self.tokenizer)

    def train_step(self, batch: list[dict[str, Any]], step: int) -> dict[str, float]:
        chosen, rejected = [], []
        for item in batch:
            layout_draw, tag_draw = torch.rand(2, generator=item_generator(self.train_cfg.seed, step, item["index"],
                                                                           SALT_DPO)).tolist()
            text = self.text_ids(item, tag_draw)
            chosen.append(self.sequence(item, text, item["chosen"], layout_draw))
            rejected.append(self.sequence(item, text, item["rejected"], layout_draw))
        n = len(batch)
        b = self.to_batch(chosen + rejected)  # one forward for both halves (one DDP call per step)
        select, targets, rows = targets_of(b)
        logits = self.model(b.kinds, b.ids, select)
        avg = self.cfg.average_log_probs
        logp = sequence_log_probs(logits, targets, rows, 2 * n, avg)
        with torch.no_grad():
            ref_logp = sequence_log_probs(self.ref(b.kinds, b.ids, select), targets, rows, 2 * n, avg)
        margin = self.cfg.beta * ((logp[:n] - logp[n:]) - (ref_logp[:n] - ref_logp[n:]))
        dpo = -F.logsigmoid(margin)
        on_chosen = rows < n
        sft = F.cross_entropy(logits[on_chosen].float(), targets[on_chosen], reduction="sum",
                              label_smoothing=self.cfg.label_smoothing)
        dpo_loss = dpo.sum() / global_mean_count(n, self.device)
        sft_loss = sft / global_mean_count(int(on_chosen.sum()), self.device)
        loss = dpo_loss + self.cfg.sft_weight * sft_loss
        lr = self.opt.lr
        grad_norm = self.opt.step(loss)
        return {"loss": float(loss.detach()), "dpo_loss": float(dpo_loss.detach()), "sft_loss": float(sft_loss.detach()),
                "reward_acc": float((margin > 0).float().mean()), "margin": float(margin.detach().mean()),
                "chosen_logp": float(logp[:n].detach().mean()), "rejected_logp": float(logp[n:].detach().mean()),
                "grad_norm": grad_norm, "lr": lr}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["reference"] = {k: v.detach().cpu() for k, v in self.ref.lm.state_dict().items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.ref.lm.load_state_dict(state["reference"], strict=True)
