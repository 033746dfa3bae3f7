"""Training stage ``token_reader``: a CTC character reader of a prepared corpus's speech tokens, the ``L_ASR``
backend for tokenizers without FSQ codes (``token_reader.py``; docs/training.md, "Reinforcement stage").

Data: the prepared LM corpus (``speech_tokens`` + the transcript ``text``; ``text_ids`` are not needed). Loss: the CTC
negative log-likelihood of the transcript's characters from the tokens, per character over the global batch.
Config (``token_reader:`` section, ``TokenReaderStageConfig``)::

    token_reader:
      model: {codebook_size: 453}   # TokenReaderConfig fields except vocab_size (set from the transcripts)
      lowercase: true               # the character vocabulary: from the training transcripts
      min_count: 1
      max_speech_tokens: 0          # skip longer items (0: no limit); with the LM's value, heldout_fraction and
      heldout_fraction: 0.02        #   split_seed the held-out items are the LM stage's held-out items
      split_seed: 0
      eval_every: 0                 # steps between held-out evaluations (heldout_ctc, heldout_cer in metrics.jsonl)
      eval_max_items: 200

Exports ``token_reader.safetensors`` + ``token_reader.json`` (vocabulary and held-out figures in its metadata).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cadenza.data.dataset import ShardDataset
from cadenza.errors import InputError
from cadenza.evaluation.wer import edit_distance
from cadenza.models.speech_tokenizer.char_vocab import BLANK, CharVocab
from cadenza.training.char_ctc import CharVocabCheckpoint, ctc_greedy, json_metrics
from cadenza.training.config import TrainConfig, dataclass_from_dict
from cadenza.training.distributed import global_mean_count
from cadenza.training.optim import Optimization
from cadenza.training.stage import TrainingStage, Wrap, register
from cadenza.training.token_reader import TokenReader, TokenReaderConfig, save_token_reader
from cadenza.training.wav_manifest import heldout_split


@dataclass(frozen=True)
class TokenReaderStageConfig:
    model: dict = field(default_factory=dict)
    lowercase: bool = True
    min_count: int = 1
    max_speech_tokens: int = 0
    heldout_fraction: float = 0.02
    split_seed: int = 0
    eval_every: int = 0
    eval_max_items: int = 200

    def __post_init__(self) -> None:
        if "vocab_size" in self.model:
            raise InputError("token_reader.model.vocab_size is set from the training transcripts; remove it")
        if "codebook_size" not in self.model:
            raise InputError("token_reader.model.codebook_size is required: the LM's speech vocabulary "
                             "(llm.speech_token_size, e.g. 453 for cadenza-tiny v2)")
        if self.min_count < 1 or self.max_speech_tokens < 0 or self.eval_every < 0 or self.eval_max_items < 1:
            raise InputError("token_reader: min_count and eval_max_items must be >= 1, max_speech_tokens and "
                             "eval_every >= 0")
        if not 0 <= self.heldout_fraction < 1:
            raise InputError(f"token_reader.heldout_fraction must be in [0, 1), got {self.heldout_fraction}")


class TranscribedTokens(torch.utils.data.Dataset):
    """``[i] -> {"tokens": [T] int64, "labels": [n] int64, "text": str, "id": str}`` for the corpus items
    ``indices`` (positions in ``ShardDataset``)."""

    def __init__(self, base: ShardDataset, indices: Sequence[int], vocab: CharVocab, codebook_size: int) -> None:
        self.base, self.indices, self.vocab, self.codebook_size = base, list(indices), vocab, codebook_size

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.base[self.indices[i]]
        tokens = item["speech_tokens"].long()
        if int(tokens.max()) >= self.codebook_size or int(tokens.min()) < 0:
            raise InputError(f"item {item['id']!r}: speech token {int(tokens.max())} outside [0, codebook_size="
                             f"{self.codebook_size}): the reader must be built for the LM's speech vocabulary")
        text = item.get("text") or ""
        return {"tokens": tokens, "labels": torch.tensor(self.vocab.encode(text), dtype=torch.long), "text": text,
                "id": item["id"]}


def collate_tokens(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """-> ``tokens [B, T_max]`` (0 padded), ``mask [B, T_max]`` bool, ``labels`` (concatenated), ``label_lengths
    [B]``, ``lengths [B]``."""
    lengths = torch.tensor([it["tokens"].numel() for it in items])
    tokens = torch.zeros(len(items), int(lengths.max()), dtype=torch.long)
    for b, it in enumerate(items):
        tokens[b, : it["tokens"].numel()] = it["tokens"]
    mask = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]
    labels = torch.cat([it["labels"] for it in items])
    return {"tokens": tokens, "mask": mask, "lengths": lengths, "labels": labels,
            "label_lengths": torch.tensor([it["labels"].numel() for it in items])}


@register
class TokenReaderStage(CharVocabCheckpoint, TrainingStage):
    name = "token_reader"

    def __init__(self, config: dict[str, Any], data_dir: Path) -> None:
        super().__init__(config, data_dir)
        self.train_cfg = TrainConfig.from_dict(config.get("train"))
        self.stage_cfg = dataclass_from_dict(TokenReaderStageConfig, config.get("token_reader"), "token_reader")
        # checked now, before any data is read: a bad size fails at load (vocab_size 2 stands in for the real one)
        TokenReaderConfig.from_dict({**self.stage_cfg.model, "vocab_size": 2})
        self._prepared = False

    def _prepare(self) -> None:
        """Open the corpus, keep the items with tokens and a transcript, split off the held-out ones, build the
        vocabulary from the training transcripts (deterministic: every rank and every resumed run gets the same)."""
        if self._prepared:
            return
        c = self.stage_cfg
        self.base = ShardDataset(self.data_dir, ("speech_tokens",))
        keep, no_text = [], []
        for i in range(len(self.base)):
            n = self.base.shapes(i)["speech_tokens"][0]
            if n == 0 or (c.max_speech_tokens and n > c.max_speech_tokens):
                continue
            if not (self.base.entries[i].get("text") or "").strip():
                no_text.append(self.base.entries[i].get("id"))
                continue
            keep.append(i)
        if no_text:
            raise InputError(f"the token reader needs a transcript ('text') for every item; missing for "
                             f"{no_text[:5]}{' ...' if len(no_text) > 5 else ''}")
        if not keep:
            raise InputError(f"no usable items in {self.data_dir}: need speech_tokens (within max_speech_tokens)")
        # split over the kept items, as the LM stage splits its items: the same settings hold out the same items
        train_pos, heldout_pos = heldout_split(len(keep), c.heldout_fraction, c.split_seed)
        self.train_idx = [keep[p] for p in train_pos]
        self.heldout_idx = [keep[p] for p in heldout_pos]
        self.vocab = CharVocab.from_texts((self.base.entries[i]["text"] for i in self.train_idx), c.min_count,
                                          c.lowercase)
        self.cfg = TokenReaderConfig.from_dict({**c.model, "vocab_size": len(self.vocab)})
        self._prepared = True

    def _items(self, indices: Sequence[int]) -> TranscribedTokens:
        return TranscribedTokens(self.base, indices, self.vocab, self.cfg.codebook_size)

    def setup(self, device: torch.device, wrap: Wrap) -> None:
        self._prepare()
        self.device = torch.device(device)
        self.model = TokenReader(self.cfg).to(self.device).train()
        self.wrapped = wrap(self.model)
        self.opt = Optimization(self.model.parameters(), self.train_cfg.optim, self.train_cfg.max_steps)

    def dataset(self) -> TranscribedTokens:
        self._prepare()
        return self._items(self.train_idx)

    def collate(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate_tokens(items)

    def _ctc(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(per-item CTC NLL ``[B]``, log-probs ``[B, T*r, C]``, their lengths ``[B]``); an impossible alignment
        (fewer frames than the transcript needs) is 0."""
        log_probs = model(batch["tokens"].to(self.device), batch["mask"].to(self.device))
        lengths = batch["lengths"].to(self.device) * self.cfg.frames_per_token
        nll = F.ctc_loss(log_probs.transpose(0, 1), batch["labels"].to(self.device), lengths,
                         batch["label_lengths"].to(self.device), blank=BLANK, reduction="none", zero_infinity=True)
        return nll, log_probs, lengths

    def train_step(self, batch: dict[str, Any], step: int) -> dict[str, float]:
        nll, _, _ = self._ctc(self.wrapped, batch)
        n_chars = int(batch["label_lengths"].sum())
        loss = nll.sum() / global_mean_count(n_chars, self.device)
        lr = self.opt.lr
        grad = self.opt.step(loss)
        feasible = (nll.detach() > 0) | (batch["label_lengths"].to(self.device) == 0)
        metrics = {"loss": float(loss.detach()), "ctc_feasible": float(feasible.float().mean()), "grad_norm": grad,
                   "lr": lr}
        if self.stage_cfg.eval_every > 0 and (step + 1) % self.stage_cfg.eval_every == 0:
            metrics.update(self.evaluate())
        return metrics

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """CTC loss (nats per character) and greedy-CTC character error rate on up to ``eval_max_items`` held-out
        items (the first training ones if none are held out). Keys are prefixed ``heldout_`` (or ``train_``)."""
        self._prepare()
        prefix, indices = ("heldout_", self.heldout_idx) if self.heldout_idx else ("train_", self.train_idx)
        items = self._items(indices[: self.stage_cfg.eval_max_items])
        was_training = self.model.training
        self.model.eval()
        total = edits = chars = 0.0
        for start in range(0, len(items), 16):
            batch = collate_tokens([items[i] for i in range(start, min(start + 16, len(items)))])
            nll, log_probs, lengths = self._ctc(self.model, batch)
            total += float(nll.sum())
            refs = torch.split(batch["labels"], batch["label_lengths"].tolist())
            for hyp, ref in zip(ctc_greedy(log_probs, lengths), refs):
                edits += edit_distance(hyp, ref.tolist())
                chars += ref.numel()
        self.model.train(was_training)
        return {prefix + "ctc": total / max(chars, 1), prefix + "cer": edits / max(chars, 1),
                prefix + "items": float(len(items))}

    def export(self, out_dir: Path) -> None:
        """``token_reader.safetensors`` + ``token_reader.json`` with the held-out figures in ``metadata``."""
        metrics = self.evaluate()
        metadata = json_metrics(metrics)
        save_token_reader(self.model, self.vocab, out_dir, metadata)
