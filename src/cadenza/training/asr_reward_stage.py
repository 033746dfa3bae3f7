"""Stage ``asr_reward``: tune the LM with the differentiable ASR reward ``L_ASR``, alone or with ``L_DPO``.

See docs/training.md, "Reinforcement stage", and ``asr_reward.py`` for the path from LM logits to the CTC loss.

Each step teacher-forces the LM on speech tokens of a text (the corpus's, or a preference pair's *chosen* tokens),
draws one straight-through Gumbel-softmax token at every speech position from the LM's distribution there, and asks
the frozen ASR backend of the speech tokenizer to read the transcript back. Loss::

    asr_weight * L_ASR  +  dpo_weight * L_DPO  +  sft_weight * CE(speech targets)

``L_ASR`` is the CTC negative log-likelihood of the transcript's characters, per character over the global batch;
``L_DPO`` is the ``dpo`` stage's loss (frozen reference = the LM at the start). With ``dpo_weight: 0`` (L_ASR alone)
the data is the prepared LM corpus (``speech_tokens`` + the transcript); with ``dpo_weight > 0`` it is the pairs file
(each pair needs its ``text``; ``cadenza data dpo-pairs`` writes it), L_ASR on the chosen tokens.

Config (``asr_reward:`` section; also every ``lm:`` key, ``mix_probability`` defaulting to 0)::

    asr_reward:
      tokenizer: runs/tokenizer        # `cadenza train tokenizer --out` folder (its checkpoints hold the CTC head)
      reader: null                     # or: a `cadenza train token_reader --out` folder (tokenizers without FSQ
                                       #   codes, e.g. cadenza-tiny v2); exactly one of the two
      temperature: 1.0                 # Gumbel-softmax temperature of the relaxed backward path
      straight_through: true           # forward = hard sampled tokens (false: the relaxed soft tokens)
      asr_weight: 1.0
      dpo_weight: 0.0                  # > 0: add L_DPO on `pairs` (the paper's best: both)
      sft_weight: 0.0                  # cross-entropy on the teacher-forced tokens (keeps the LM near its data)
      pairs: preference_pairs.jsonl    # with dpo_weight > 0, relative to the data folder
      beta: 0.01
      average_log_probs: true
      init_llm: /path/to/llm.pt         # the LM to tune (also the frozen DPO reference)

The tokenizer's codebook must be the LM's speech vocabulary (the LM was trained on that tokenizer's ids).

With ``heldout_fraction > 0`` (L_ASR alone, on the corpus) that share of the corpus stays out of training (the LM
stage's split: the same ``max_speech_tokens`` / ``heldout_fraction`` / ``split_seed`` hold out the LM's own
held-out items), and ``eval_every: N`` logs ``heldout_asr_loss`` every N steps: L_ASR of up to ``eval_max_items``
held-out items, unistream, each item's Gumbel draws fixed for the whole run (so the figures of two steps or two runs
compare the LMs, not the noise), averaged over ``eval_draws`` draws.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset

from cadenza.errors import InputError
from cadenza.training.asr_reward import asr_nll, gumbel_noise, load_asr_backend, speech_positions
from cadenza.training.distributed import global_mean_count
from cadenza.training.dpo_stage import DPOStageConfig, PairItems
from cadenza.training.lm_data import LMItems
from cadenza.training.lm_model import LMForTraining, sequence_log_probs, targets_of
from cadenza.training.lm_stage import LMStageBase
from cadenza.training.seeding import item_generator
from cadenza.training.stage import Wrap, register
from cadenza.training.wav_manifest import heldout_split

log = logging.getLogger(__name__)
SALT_ASR = 3
SALT_GUMBEL = 4
SALT_HELDOUT = 5


@dataclass(frozen=True)
class ASRRewardStageConfig(DPOStageConfig):
    tokenizer: str | None = None
    reader: str | None = None
    temperature: float = 1.0
    straight_through: bool = True
    asr_weight: float = 1.0
    dpo_weight: float = 0.0
    sft_weight: float = 0.0
    eval_draws: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tokenizer and not self.reader:
            raise InputError("asr_reward.tokenizer is required (the `cadenza train tokenizer --out` folder whose CTC "
                             "head reads the LM's tokens), or asr_reward.reader (a `cadenza train token_reader --out` "
                             "folder, for tokenizers without FSQ codes)")
        if self.tokenizer and self.reader:
            raise InputError("asr_reward: give either tokenizer or reader, not both")
        if self.dpo_weight > 0 and self.heldout_fraction > 0:
            raise InputError("asr_reward.heldout_fraction holds corpus items out (dpo_weight 0); with dpo_weight > 0 "
                             "the data is the pairs file: set heldout_fraction to 0")
        if self.eval_draws < 1:
            raise InputError(f"asr_reward.eval_draws must be >= 1, got {self.eval_draws}")
        if not self.temperature > 0:
            raise InputError(f"asr_reward.temperature must be > 0, got {self.temperature}")
        if self.asr_weight < 0 or self.dpo_weight < 0 or self.asr_weight + self.dpo_weight == 0:
            raise InputError("asr_reward: asr_weight and dpo_weight must be >= 0 and not both 0")


class TranscribedLMItems(LMItems):
    """LM corpus items with their transcript (``"text"``) for the CTC target."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = super().__getitem__(i)
        item["text"] = self.base.entries[self.keep[i]].get("text") or ""
        return item


@register
class ASRRewardStage(LMStageBase):
    name = "asr_reward"
    section = "asr_reward"
    config_class = ASRRewardStageConfig

    def setup(self, device: torch.device, wrap: Wrap) -> None:
        if not self.cfg.init_llm:
            log.warning("asr_reward without init_llm: tuning a randomly initialised LM")
        where = self.cfg.reader or self.cfg.tokenizer
        self.backend = load_asr_backend(where, device)
        speech_vocab = self.lm_cfg.speech_token_size
        if self.backend.model.codebook_size != speech_vocab:
            what = "token reader" if self.cfg.reader else "tokenizer"
            raise InputError(f"the {what} at {where} has {self.backend.model.codebook_size} token ids but the LM "
                             f"speaks {speech_vocab}: L_ASR needs a backend for the ids the LM was trained on")
        super().setup(device, wrap)
        self.ref = None
        if self.cfg.dpo_weight > 0:
            self.ref = LMForTraining(copy.deepcopy(self.lm)).eval().requires_grad_(False)

    @property
    def uses_pairs(self) -> bool:
        return self.cfg.dpo_weight > 0

    def dataset(self) -> Dataset:
        if self.uses_pairs:
            items = PairItems(self.data_dir / self.cfg.pairs, self.tokenizer)
            no_text = [p["id"] for p in items.pairs if not p.get("text")]
            if no_text and self.cfg.asr_weight > 0:
                raise InputError(f"{self.data_dir / self.cfg.pairs}: L_ASR needs each pair's text (the CTC target); "
                                 f"{len(no_text)} pairs have only text_ids (e.g. {no_text[:3]})")
            return items
        items = TranscribedLMItems(self.data_dir, self.tokenizer, self.cfg.max_speech_tokens,
                                   self.cfg.max_text_tokens)
        train_idx, self.heldout_idx = heldout_split(len(items), self.cfg.heldout_fraction, self.cfg.split_seed)
        self.all_items = items
        return items if not self.heldout_idx else Subset(items, train_idx)

    def labels(self, text: str, item_id: str) -> list[int]:
        ids = self.backend.vocab.encode(text)
        if not ids:
            raise InputError(f"item {item_id!r} has no transcript: L_ASR needs the text of every item")
        return ids

    def train_step(self, batch: list[dict[str, Any]], step: int) -> dict[str, float]:
        seqs, rejected, labels, noise_gens = [], [], [], []
        for item in batch:
            layout_draw, tag_draw = torch.rand(2, generator=item_generator(self.train_cfg.seed, step, item["index"],
                                                                           SALT_ASR)).tolist()
            text = self.text_ids(item, tag_draw)
            speech = item["chosen"] if self.uses_pairs else item["speech_tokens"]
            seqs.append(self.sequence(item, text, speech, layout_draw))
            if self.uses_pairs:
                rejected.append(self.sequence(item, text, item["rejected"], layout_draw))
            if self.cfg.asr_weight > 0:
                labels.append(self.labels(item.get("text", ""), item["id"]))
                noise_gens.append(item_generator(self.train_cfg.seed, step, item["index"], SALT_GUMBEL))
        n = len(batch)
        b = self.to_batch(seqs + rejected)  # one forward for everything (one DDP call per step)
        select, targets, rows = targets_of(b)
        logits = self.model(b.kinds, b.ids, select)
        metrics: dict[str, float] = {}
        loss = logits.new_zeros((), dtype=torch.float32)
        first = rows < n  # the corpus / chosen sequences
        if self.cfg.asr_weight > 0:
            asr_loss, feasible, n_chars = self.asr_loss(logits[first], targets[first], rows[first], n, labels,
                                                        noise_gens)
            loss = loss + self.cfg.asr_weight * asr_loss
            metrics.update({"asr_loss": float(asr_loss.detach()), "asr_feasible": float(feasible.float().mean()),
                            "asr_chars": n_chars})
        if self.cfg.sft_weight > 0:
            sft = F.cross_entropy(logits[first].float(), targets[first], reduction="sum",
                                  label_smoothing=self.cfg.label_smoothing)
            sft_loss = sft / global_mean_count(int(first.sum()), self.device)
            loss = loss + self.cfg.sft_weight * sft_loss
            metrics["sft_loss"] = float(sft_loss.detach())
        if self.uses_pairs:
            avg = self.cfg.average_log_probs
            logp = sequence_log_probs(logits, targets, rows, 2 * n, avg)
            with torch.no_grad():
                ref_logp = sequence_log_probs(self.ref(b.kinds, b.ids, select), targets, rows, 2 * n, avg)
            margin = self.cfg.beta * ((logp[:n] - logp[n:]) - (ref_logp[:n] - ref_logp[n:]))
            dpo_loss = -F.logsigmoid(margin).sum() / global_mean_count(n, self.device)
            loss = loss + self.cfg.dpo_weight * dpo_loss
            metrics.update({"dpo_loss": float(dpo_loss.detach()), "reward_acc": float((margin > 0).float().mean()),
                            "margin": float(margin.detach().mean())})
        lr = self.opt.lr
        grad_norm = self.opt.step(loss)
        if self.cfg.eval_every > 0 and (step + 1) % self.cfg.eval_every == 0:
            metrics.update(self.evaluate())
        return {"loss": float(loss.detach()), **metrics, "grad_norm": grad_norm, "lr": lr}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """L_ASR (nats per character) and the feasible share on up to ``eval_max_items`` held-out corpus items,
        unistream, no speaker tags; item k's draw d is ``item_generator(seed, d, k, SALT_HELDOUT)``, the same at every
        evaluation. Empty when nothing is held out."""
        if not getattr(self, "heldout_idx", None):
            return {}
        model = getattr(self.model, "module", self.model)  # not through DDP: every rank evaluates the same items
        was_training = model.training
        model.eval()
        total = chars = 0.0
        feasible = []
        indices = self.heldout_idx[: self.cfg.eval_max_items]
        for start in range(0, len(indices), 16):
            items = [self.all_items[i] for i in indices[start: start + 16]]
            b = self.to_batch([self.sequence(it, it["text_ids"], it["speech_tokens"], 1.0) for it in items])
            select, targets, rows = targets_of(b)
            logits = model(b.kinds, b.ids, select)
            labels = [self.labels(it["text"], it["id"]) for it in items]
            speech_vocab = self.lm_cfg.speech_token_size
            which, slot, lengths = speech_positions(targets, rows, len(items), speech_vocab)
            for draw in range(self.cfg.eval_draws):
                noise = torch.cat([gumbel_noise((int(k), speech_vocab),
                                                item_generator(self.train_cfg.seed, draw, idx, SALT_HELDOUT))
                                   for k, idx in zip(lengths.tolist(), indices[start: start + 16])])
                nll, ok = asr_nll(self.backend.model, logits[which, :speech_vocab], slot, lengths, labels,
                                  self.cfg.temperature, self.cfg.straight_through, noise=noise)
                total += float(nll.sum())
                feasible.append(ok.float())
            chars += self.cfg.eval_draws * sum(len(x) for x in labels)
        model.train(was_training)
        return {"heldout_asr_loss": total / max(chars, 1.0), "heldout_asr_feasible": float(torch.cat(feasible).mean()),
                "heldout_items": float(len(indices))}

    def asr_loss(self, logits: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, n: int,
                 labels: list[list[int]], noise_gens: list[torch.Generator] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """L_ASR of n teacher-forced sequences: logits ``[N, V + 3]`` of their scored positions -> (loss per
        transcript character over the global batch, feasible ``[n]`` bool, characters in this batch).

        ``noise_gens``: one generator per sequence for its Gumbel draws (``item_generator``: the draws then do not
        depend on the rank or the batch, so N processes reproduce one); None: the global RNG."""
        speech_vocab = self.lm_cfg.speech_token_size
        which, slot, lengths = speech_positions(targets, rows, n, speech_vocab)
        noise = None
        if noise_gens is not None:  # row-major, as the slots: each sequence's draws in its own order
            noise = torch.cat([gumbel_noise((int(k), speech_vocab), g) for k, g in zip(lengths.tolist(), noise_gens)])
        nll, feasible = asr_nll(self.backend.model, logits[which, :speech_vocab], slot, lengths, labels,
                                self.cfg.temperature, self.cfg.straight_through, noise=noise)
        n_chars = sum(len(x) for x in labels)
        return nll.sum() / global_mean_count(n_chars, self.device), feasible, float(n_chars)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.ref is not None:
            state["reference"] = {k: v.detach().cpu() for k, v in self.ref.lm.state_dict().items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict({k: v for k, v in state.items() if k != "reference"})
        if self.ref is not None:
            self.ref.lm.load_state_dict(state["reference"], strict=True)
