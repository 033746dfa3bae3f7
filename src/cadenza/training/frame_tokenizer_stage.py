"""Training stage "frame_tokenizer": a speech tokenizer that classifies every 25 Hz frame into given labels.

For token vocabularies defined by an alignment rather than learned (cadenza-tiny v2: the phoneme each 40 ms frame
lies in, with its stress, from the teacher's own durations; docs/cadenza-tiny.md), the tokenizer's only job is to
recover those labels from audio — for prompt audio (zero-shot cloning) and voice conversion. Same encoder as the FSQ
tokenizer (whisper log-mel -> strided convs -> rotary transformer), with a linear classifier in place of FSQ,
trained with frame cross-entropy against the ``speech_tokens`` already stored in the prepared corpus.

Config (``frame_tokenizer:`` section, ``FrameTokenizerStageConfig``)::

    frame_tokenizer:
      model: {}                   # SpeechTokenizerConfig fields (frame_classes: the label count, required)
      heldout_fraction: 0.02
      split_seed: 0
      eval_every: 0               # steps between held-out evaluations (heldout_frame_acc in metrics.jsonl)
      eval_max_items: 100
      max_seconds: 15.0           # longer items are cut (labels with them)
      augment: {}                 # VoiceAugmentConfig fields: other voices saying the same frames (voice_augment.py)
      init_tokenizer: null        # a trained frame tokenizer to continue (its folder or either of its two files);
                                  # its config must equal model: (same classes, same sizes)

Exports ``speech_tokenizer.safetensors`` + ``speech_tokenizer.json`` (held-out frame accuracy in its metadata).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cadenza.audio.resample import resample
from cadenza.audio.whisper_mel import WHISPER_SAMPLE_RATE, whisper_log_mel
from cadenza.builtin import local_model_path
from cadenza.data.dataset import ShardDataset
from cadenza.errors import InputError
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
from cadenza.models.speech_tokenizer.inference import load_speech_tokenizer, save_speech_tokenizer
from cadenza.models.speech_tokenizer.model import SpeechTokenizerModel
from cadenza.training.config import TrainConfig, dataclass_from_dict
from cadenza.training.optim import Optimization
from cadenza.training.stage import TrainingStage, Wrap, register
from cadenza.training.voice_augment import VoiceAugmentConfig, augmented_log_mel, draw, stretch_labels
from cadenza.training.wav_manifest import heldout_split

IGNORE = -100
SHARD_SAMPLE_RATE = 24000


@dataclass(frozen=True)
class FrameTokenizerStageConfig:
    model: dict = field(default_factory=dict)
    heldout_fraction: float = 0.02
    split_seed: int = 0
    eval_every: int = 0
    eval_max_items: int = 100
    max_seconds: float = 15.0
    init_tokenizer: str | None = None
    augment: dict = field(default_factory=dict)  # VoiceAugmentConfig fields (training items only)


class LabelledMels(torch.utils.data.Dataset):
    """Item: ``{"mel": [n_mels, T] whisper log-mel at 100 Hz, "labels": [T // downsample] int64}``.

    With ``augment``, item ``i`` is heard in a voice drawn from ``(seed, i, epoch)`` alone (the launcher calls
    :meth:`set_epoch`), so a resumed run, any number of loader workers and any batch order draw the same voices as
    one uninterrupted run; an item gets a new voice each epoch."""

    def __init__(self, base: ShardDataset, indices: Sequence[int], cfg: SpeechTokenizerConfig, max_seconds: float,
                 augment: VoiceAugmentConfig | None = None, seed: int = 0):
        self.base, self.indices, self.cfg = base, list(indices), cfg
        self.max_samples = int(max_seconds * WHISPER_SAMPLE_RATE)
        self.augment = augment if augment is not None and augment.enabled else None
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = self.base[self.indices[i]]
        wav = resample(item["wav"].float(), SHARD_SAMPLE_RATE, WHISPER_SAMPLE_RATE)[: self.max_samples]
        mel = whisper_log_mel(wav, n_mels=self.cfg.n_mels)[0]
        n = min(mel.shape[-1] // self.cfg.downsample, item["speech_tokens"].numel())
        labels = item["speech_tokens"][:n].long()
        if labels.numel() and (int(labels.max()) >= self.cfg.frame_classes or int(labels.min()) < 0):
            raise InputError(f"{item['id']}: speech_tokens outside [0, frame_classes={self.cfg.frame_classes})")
        if self.augment is not None:  # another voice saying the same frames (training items only)
            rng = np.random.default_rng([self.seed, self.indices[i], self.epoch])
            voice = draw(self.augment, rng)
            if voice is not None:
                mel = augmented_log_mel(wav, voice, self.cfg.n_mels, rng)
                n = mel.shape[-1] // self.cfg.downsample
                labels = stretch_labels(labels, n)
        return {"mel": mel[:, : n * self.cfg.downsample], "labels": labels}


def collate_labelled(items: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """-> ``mel [B, n_mels, T_max]`` (zero padded), ``mel_lengths [B]``, ``labels [B, L_max]`` (-100 padded)."""
    mel_lengths = torch.tensor([it["mel"].shape[-1] for it in items])
    mel = torch.zeros(len(items), items[0]["mel"].shape[0], int(mel_lengths.max()))
    labels = torch.full((len(items), max(it["labels"].numel() for it in items)), IGNORE, dtype=torch.long)
    for b, it in enumerate(items):
        mel[b, :, : it["mel"].shape[-1]] = it["mel"]
        labels[b, : it["labels"].numel()] = it["labels"]
    return {"mel": mel, "mel_lengths": mel_lengths, "labels": labels}


@register
class FrameTokenizerStage(TrainingStage):
    name = "frame_tokenizer"

    def __init__(self, config: dict[str, Any], data_dir: Path) -> None:
        super().__init__(config, data_dir)
        self.train_cfg = TrainConfig.from_dict(config.get("train"))
        self.stage_cfg = dataclass_from_dict(FrameTokenizerStageConfig, config.get("frame_tokenizer"),
                                             "frame_tokenizer")
        self.cfg = SpeechTokenizerConfig.from_dict(self.stage_cfg.model)
        if self.cfg.frame_classes < 2:
            raise InputError("frame_tokenizer.model.frame_classes must be the label count (>= 2)")
        self.augment = dataclass_from_dict(VoiceAugmentConfig, self.stage_cfg.augment, "frame_tokenizer.augment")
        self.base = ShardDataset(self.data_dir, ("wav", "speech_tokens"))
        self.train_idx, self.heldout_idx = heldout_split(len(self.base), self.stage_cfg.heldout_fraction,
                                                         self.stage_cfg.split_seed)

    def setup(self, device: torch.device, wrap: Wrap) -> None:
        self.device = torch.device(device)
        self.model = SpeechTokenizerModel(self.cfg)
        if self.stage_cfg.init_tokenizer:
            self._load_init(local_model_path(self.stage_cfg.init_tokenizer))  # "cadenza-tiny": the built-in one
        self.model = self.model.to(self.device).train()
        self.wrapped = wrap(self.model)
        self.opt = Optimization(self.model.parameters(), self.train_cfg.optim, self.train_cfg.max_steps)

    def _load_init(self, path: Path) -> None:
        """Start from a trained tokenizer: its config must be this stage's model config, field for field."""
        start = load_speech_tokenizer(path).model
        if start.cfg != self.cfg:
            differ = sorted(k for k, v in start.cfg.to_dict().items() if self.cfg.to_dict().get(k) != v)
            raise InputError(f"frame_tokenizer.init_tokenizer {path}: its config differs from frame_tokenizer.model "
                             f"in {', '.join(differ)}")
        self.model.load_state_dict(start.state_dict(), strict=True)

    def _items(self, indices: Sequence[int], augment: VoiceAugmentConfig | None = None) -> LabelledMels:
        return LabelledMels(self.base, indices, self.cfg, self.stage_cfg.max_seconds, augment, self.train_cfg.seed)

    def dataset(self) -> LabelledMels:
        return self._items(self.train_idx, self.augment)

    def collate(self, items: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return collate_labelled(items)

    def _logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden, _ = self.model.encode(batch["mel"].to(self.device), batch["mel_lengths"].to(self.device))
        return self.model.frame_logits(hidden).float()

    def train_step(self, batch: dict[str, torch.Tensor], step: int) -> dict[str, float]:
        labels = batch["labels"].to(self.device)
        logits = self._logits(batch)[:, : labels.shape[1]]
        loss = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE)
        lr = self.opt.lr
        grad = self.opt.step(loss)
        real = labels != IGNORE
        acc = float((logits.detach().argmax(-1) == labels)[real].float().mean())
        metrics = {"loss": float(loss.detach()), "frame_acc": acc, "grad_norm": grad, "lr": lr}
        if self.stage_cfg.eval_every > 0 and (step + 1) % self.stage_cfg.eval_every == 0:
            metrics.update(self.evaluate())
        return metrics

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Frame accuracy and cross-entropy on the held-out items (the first training ones if there are none)."""
        prefix, indices = ("heldout_", self.heldout_idx) if self.heldout_idx else ("train_", self.train_idx)
        items = self._items(indices[: self.stage_cfg.eval_max_items])
        was_training = self.model.training
        self.model.eval()
        right = total = 0
        ce = 0.0
        for i in range(len(items)):
            batch = collate_labelled([items[i]])
            labels = batch["labels"].to(self.device)
            logits = self._logits(batch)[:, : labels.shape[1]]
            ce += float(F.cross_entropy(logits.transpose(1, 2), labels, reduction="sum"))
            right += int((logits.argmax(-1) == labels).sum())
            total += labels.numel()
        self.model.train(was_training)
        return {prefix + "frame_acc": right / max(total, 1), prefix + "ce": ce / max(total, 1)}

    def state_dict(self) -> dict[str, Any]:
        return {"model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                "optim": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"], strict=True)
        self.opt.load_state_dict(state["optim"])

    def export(self, out_dir: Path) -> None:
        metrics = self.evaluate()
        metadata = {**{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()},
                    "codebook_size": self.cfg.codebook_size, "labels": "frame classes (see the model's docs)"}
        save_speech_tokenizer(self.model, out_dir, metadata)
