"""Training stage "speaker": the CAM++-style speaker encoder, as a speaker classifier with AAM-softmax.

Optimiser from ``train.optim`` (e.g. AdamW, lr 1e-3); stage settings (``speaker:`` section,
``SpeakerStageConfig``)::

    speaker:
      model: {}                   # SpeakerEncoderConfig fields
      margin: 0.2                 # additive angular margin over the training speakers ...
      scale: 32.0
      margin_warmup_steps: 0      # ... grown linearly from 0 over these steps
      crop_seconds: 3.0           # random training crop (shorter audio is repeated)
      heldout_fraction: 0.1       # taken within every speaker
      split_seed: 0
      eval_every: 0               # steps between held-out evaluations (0: only at export)
      eval_max_utterances: 200
      eval_max_seconds: 10.0
      data_format: auto           # auto | shards | manifest (see wav_manifest); needs speaker ids
      manifest: manifest.jsonl
      shard_sample_rate: 24000

Crops are drawn in ``train_step`` from per-item random streams (``seeding.item_generator``), so resumed and
multi-process runs see the same crops. Held-out evaluation: embeddings of the held-out utterances (whole, up to
``eval_max_seconds``), cosine scores of all pairs, the equal error rate and the gap between the mean same-speaker
and different-speaker scores. The export writes ``speaker_encoder.safetensors`` + ``speaker_encoder.json`` with
these figures in its ``metadata``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.audio.kaldi_fbank import campplus_features
from cadenza.errors import InputError
from cadenza.models.speaker_encoder.config import SpeakerEncoderConfig
from cadenza.models.speaker_encoder.inference import load_speaker_encoder, save_speaker_encoder
from cadenza.models.speaker_encoder.model import SpeakerEncoderModel
from cadenza.training.config import TrainConfig, dataclass_from_dict
from cadenza.training.optim import Optimization
from cadenza.training.seeding import item_generator
from cadenza.training.stage import TrainingStage, Wrap, register
from cadenza.training.wav_manifest import MANIFEST_NAME, SourceItems, heldout_split, open_utterances

SAMPLE_RATE = 16000  # the fbank front end (campplus_features) is defined at 16 kHz
SALT_CROP = 13


@dataclass(frozen=True)
class SpeakerStageConfig:
    model: dict = field(default_factory=dict)
    margin: float = 0.2
    scale: float = 32.0
    margin_warmup_steps: int = 0
    crop_seconds: float = 3.0
    heldout_fraction: float = 0.1
    split_seed: int = 0
    eval_every: int = 0
    eval_max_utterances: int = 200
    eval_max_seconds: float = 10.0
    data_format: str = "auto"
    manifest: str = MANIFEST_NAME
    shard_sample_rate: int = 24000


def repeat_crop(wav: torch.Tensor, length: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A random ``length``-sample window; shorter audio is repeated (not zero-padded: silence would be a "speaker"
    feature of short files)."""
    if wav.shape[0] < length:
        wav = wav.repeat(math.ceil(length / max(wav.shape[0], 1)))
    start = int(torch.randint(0, wav.shape[0] - length + 1, (1,), generator=generator))
    return wav[start:start + length]


class LabelledUtterances(SourceItems):
    """Whole 16 kHz utterances with their speaker index: ``{"index", "wav", "f0", "label"}``."""

    def __init__(self, source, indices: Sequence[int], labels: Sequence[int]) -> None:
        super().__init__(source, list(indices), SAMPLE_RATE)
        self.labels = list(labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**super().__getitem__(i), "label": self.labels[i]}


class AAMSoftmax(nn.Module):
    """Additive angular margin softmax (ArcFace): logits ``s * cos(theta_y + m)`` for the true class, ``s * cos``
    for the others. Past ``theta = pi - m`` the margin is replaced by the linear ``cos - m sin(m)`` (keeps the
    target logit monotonic). ``[B, E]``, labels ``[B]`` -> (loss, accuracy)."""

    def __init__(self, embedding_size: int, classes: int, scale: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(classes, embedding_size))
        nn.init.xavier_normal_(self.weight)
        self.scale = scale

    def forward(self, emb: torch.Tensor, labels: torch.Tensor, margin: float) -> tuple[torch.Tensor, torch.Tensor]:
        cos = F.linear(F.normalize(emb), F.normalize(self.weight)).clamp(-1 + 1e-7, 1 - 1e-7)
        sin = torch.sqrt(1 - cos**2)
        phi = cos * math.cos(margin) - sin * math.sin(margin)
        phi = torch.where(cos > math.cos(math.pi - margin), phi, cos - math.sin(math.pi - margin) * margin)
        target = F.one_hot(labels, cos.shape[1]).bool()
        logits = self.scale * torch.where(target, phi, cos)
        loss = F.cross_entropy(logits, labels)
        accuracy = (cos.argmax(1) == labels).float().mean()
        return loss, accuracy


class SpeakerClassifier(nn.Module):
    """Encoder + AAM head as one module (one DDP forward): ``fbank [B, T, n_mels]``, labels -> (loss, accuracy)."""

    def __init__(self, encoder: SpeakerEncoderModel, classes: int, scale: float) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = AAMSoftmax(encoder.cfg.embedding_size, classes, scale)

    def forward(self, fbank: torch.Tensor, labels: torch.Tensor, margin: float) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(self.encoder(fbank), labels, margin)


def equal_error_rate(scores: torch.Tensor, same: torch.Tensor) -> float:
    """EER of verification ``scores [N]`` (higher = same) against bool ``same [N]``: the rate where false
    acceptances equal false rejections (linear interpolation between the two closest thresholds)."""
    order = torch.argsort(scores, descending=True)
    same = same[order].double()
    n_same, n_diff = same.sum(), (1 - same).sum()
    if n_same == 0 or n_diff == 0:
        return float("nan")
    # Accepting the top k scores: false rejections = same pairs not accepted, false acceptances = diff pairs accepted.
    frr = torch.cat([same.new_ones(1), 1 - same.cumsum(0) / n_same])
    far = torch.cat([same.new_zeros(1), (1 - same).cumsum(0) / n_diff])
    k = int(torch.nonzero(far >= frr)[0])
    if k == 0:
        return 0.0
    d0, d1 = float(frr[k - 1] - far[k - 1]), float(frr[k] - far[k])
    w = d0 / (d0 - d1) if d0 != d1 else 0.0
    return float((1 - w) * far[k - 1] + w * far[k])


@register
class SpeakerEncoderStage(TrainingStage):
    name = "speaker"

    def __init__(self, config: dict[str, Any], data_dir: Path) -> None:
        super().__init__(config, data_dir)
        self.train_cfg = TrainConfig.from_dict(config.get("train"))
        self.stage_cfg = dataclass_from_dict(SpeakerStageConfig, config.get("speaker"), "speaker")
        self.cfg = SpeakerEncoderConfig.from_dict(self.stage_cfg.model)
        self.crop_samples = int(self.stage_cfg.crop_seconds * SAMPLE_RATE)
        self.eval_samples = int(self.stage_cfg.eval_max_seconds * SAMPLE_RATE)
        if self.crop_samples < 400 + 160 * 4:  # one fbank window plus the encoder's minimum frames
            raise InputError(f"speaker.crop_seconds {self.stage_cfg.crop_seconds} is too short")
        self._prepared = False

    def _prepare(self) -> None:
        if self._prepared:
            return
        c = self.stage_cfg
        self.source = open_utterances(self.data_dir, c.data_format, c.manifest, c.shard_sample_rate)
        speakers = [self.source.meta(i).speaker for i in range(len(self.source))]
        missing = [self.source.meta(i).id for i, s in enumerate(speakers) if s is None]
        if missing:
            raise InputError(f"the speaker stage needs a 'speaker' for every utterance; missing for {missing[:5]}")
        self.train_idx, self.heldout_idx = heldout_split(len(self.source), c.heldout_fraction, c.split_seed,
                                                         groups=speakers)
        self.speakers = sorted({speakers[i] for i in self.train_idx})
        if len(self.speakers) < 2:
            raise InputError("speaker classification needs at least two training speakers")
        index = {s: i for i, s in enumerate(self.speakers)}
        self.train_labels = [index[speakers[i]] for i in self.train_idx]
        self.all_speakers = speakers
        self._prepared = True

    def setup(self, device: torch.device, wrap: Wrap) -> None:
        self._prepare()
        self.device = torch.device(device)
        self.model = SpeakerClassifier(SpeakerEncoderModel(self.cfg), len(self.speakers), self.stage_cfg.scale)
        self.model.to(self.device).train()
        self.wrapped = wrap(self.model)
        self.opt = Optimization(self.model.parameters(), self.train_cfg.optim, self.train_cfg.max_steps)

    def dataset(self) -> LabelledUtterances:
        self._prepare()
        return LabelledUtterances(self.source, self.train_idx, self.train_labels)

    def collate(self, items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(items)  # crops are drawn in train_step, where the step (and so the random stream) is known

    def crops(self, items: Sequence[dict[str, Any]], step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Random crops -> fbank ``[B, frames, n_mels]`` and speaker labels ``[B]``."""
        feats = []
        for item in items:
            g = item_generator(self.train_cfg.seed, step, int(item["index"]), SALT_CROP)
            feats.append(campplus_features(repeat_crop(item["wav"], self.crop_samples, g), self.cfg.n_mels)[0])
        return torch.stack(feats), torch.tensor([item["label"] for item in items], dtype=torch.long)

    def current_margin(self, step: int) -> float:
        c = self.stage_cfg
        return c.margin * min(1.0, step / c.margin_warmup_steps) if c.margin_warmup_steps > 0 else c.margin

    def train_step(self, batch: dict[str, torch.Tensor], step: int) -> dict[str, float]:
        margin = self.current_margin(step)
        fbank, labels = self.crops(batch, step)
        loss, accuracy = self.wrapped(fbank.to(self.device), labels.to(self.device), margin)
        lr = self.opt.lr
        grad = self.opt.step(loss)
        metrics = {"loss": float(loss.detach()), "accuracy": float(accuracy), "margin": margin, "grad_norm": grad,
                   "lr": lr}
        if self.stage_cfg.eval_every > 0 and (step + 1) % self.stage_cfg.eval_every == 0:
            metrics.update(self.evaluate())
        return metrics

    @torch.no_grad()
    def embeddings(self, indices: Sequence[int]) -> torch.Tensor:
        """Eval-mode embeddings ``[N, E]`` of whole utterances (first ``eval.max_seconds``), one at a time."""
        encoder = self.model.encoder
        was_training = encoder.training
        encoder.eval()
        out = []
        for index in indices:
            wav = self.source.load(index, SAMPLE_RATE)[0][: self.eval_samples]
            wav = repeat_crop(wav, max(wav.shape[0], self.crop_samples // 2))  # too-short files are repeated
            out.append(encoder(campplus_features(wav, self.cfg.n_mels).to(self.device)).cpu())
        encoder.train(was_training)
        return torch.cat(out)

    def evaluate(self) -> dict[str, float]:
        """EER and cosine gap over all pairs of held-out utterances (training ones if none are held out)."""
        self._prepare()
        prefix, indices = ("heldout_", self.heldout_idx) if self.heldout_idx else ("train_", self.train_idx)
        indices = indices[: self.stage_cfg.eval_max_utterances]
        emb = F.normalize(self.embeddings(indices), dim=-1)
        scores = emb @ emb.T
        spk = [self.all_speakers[i] for i in indices]
        same = torch.tensor([[a == b for b in spk] for a in spk])
        upper = torch.triu(torch.ones_like(same), diagonal=1)
        s, m = scores[upper], same[upper]
        gap = float(s[m].mean() - s[~m].mean()) if m.any() and (~m).any() else float("nan")
        return {prefix + "eer": equal_error_rate(s, m), prefix + "cos_gap": gap,
                prefix + "same_cos": float(s[m].mean()) if m.any() else float("nan"),
                prefix + "diff_cos": float(s[~m].mean()) if (~m).any() else float("nan"),
                prefix + "utterances": float(len(indices))}

    def state_dict(self) -> dict[str, Any]:
        return {"model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                "optim": self.opt.state_dict(), "speakers": list(self.speakers)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["speakers"]) != self.speakers:
            raise InputError("the checkpoint's speaker list differs from the speakers of this data")
        self.model.load_state_dict(state["model"], strict=True)
        self.opt.load_state_dict(state["optim"])

    def export(self, out_dir: Path) -> None:
        """``speaker_encoder.safetensors`` + ``speaker_encoder.json`` (held-out EER and cosine gap in metadata)."""
        metrics = self.evaluate()
        metadata = {k: (None if math.isnan(v) else v) for k, v in metrics.items()}
        metadata["training_speakers"] = len(self.speakers)
        save_speaker_encoder(self.model.encoder, out_dir, metadata)


class TrainedSpeakerExtractor:
    """A ``cadenza data`` feature extractor: the ``spk_emb`` field (float32 ``[embedding_size]``) from a trained
    speaker encoder, in place of ``campplus.onnx``. On the command line:
    ``--extractor cadenza.training.speaker_encoder_stage:speaker_embedding_extractor=ENCODER_DIR``."""

    name, fields = "spk_emb", ("spk_emb",)

    def __init__(self, path: str | Path) -> None:
        self.encoder = load_speaker_encoder(path)

    def __call__(self, utt: Any) -> dict[str, torch.Tensor]:
        fbank = campplus_features(utt.audio_at(SAMPLE_RATE), self.encoder.config.n_mels)
        return {"spk_emb": self.encoder(fbank)[0].float()}


def speaker_embedding_extractor(path: str) -> TrainedSpeakerExtractor:
    return TrainedSpeakerExtractor(path)
