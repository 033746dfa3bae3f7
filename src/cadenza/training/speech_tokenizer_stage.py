"""Training stage "tokenizer": the supervised FSQ speech tokenizer, trained through a CTC character ASR head.

Optimiser from ``train.optim`` (e.g. AdamW, lr 1e-3, warm-up); stage settings (``tokenizer:`` section,
``TokenizerStageConfig``)::

    tokenizer:
      model: {}                   # SpeechTokenizerConfig fields except vocab_size (set from the vocabulary)
      lowercase: true             # the character vocabulary is built from the training transcripts
      min_count: 1
      heldout_fraction: 0.05
      split_seed: 0
      eval_every: 0               # steps between held-out evaluations (0: only at export)
      eval_max_utterances: 200
      data_format: auto           # auto | shards | manifest (see wav_manifest); needs transcripts
      manifest: manifest.jsonl
      shard_sample_rate: 24000

Utterances longer than ``model.max_seconds`` are truncated (their transcript then overruns the audio; the CTC loss
of such an impossible alignment is zeroed): segment the data to <= 30 s. Metrics on the held-out utterances: codebook
utilisation (fraction of the ``(2K + 1)^D`` ids used; the paper reports 100 % for FSQ vs 23 % for VQ), code
perplexity, and the greedy-CTC character error rate of the ASR head. The export writes ``speech_tokenizer.safetensors``
and ``speech_tokenizer.json`` (the held-out figures and the vocabulary go into its ``metadata``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cadenza.audio.whisper_mel import WHISPER_HOP, WHISPER_SAMPLE_RATE, whisper_log_mel
from cadenza.errors import InputError
from cadenza.evaluation.wer import edit_distance
from cadenza.models.speech_tokenizer.char_vocab import BLANK, CharVocab
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
from cadenza.models.speech_tokenizer.inference import load_speech_tokenizer, save_speech_tokenizer
from cadenza.models.speech_tokenizer.model import SupervisedSpeechTokenizer
from cadenza.training.char_ctc import CharVocabCheckpoint, ctc_greedy, json_metrics
from cadenza.training.config import TrainConfig, dataclass_from_dict
from cadenza.training.optim import Optimization
from cadenza.training.stage import TrainingStage, Wrap, register
from cadenza.training.wav_manifest import MANIFEST_NAME, UtteranceSource, heldout_split, open_utterances


@dataclass(frozen=True)
class TokenizerStageConfig:
    model: dict = field(default_factory=dict)
    lowercase: bool = True
    min_count: int = 1
    heldout_fraction: float = 0.05
    split_seed: int = 0
    eval_every: int = 0
    eval_max_utterances: int = 200
    reconstruction_weight: float = 0.0  # > 0: auxiliary L1 loss predicting the input log-mel from the codes
    saturation_weight: float = 0.0  # > 0: penalise FSQ latents deep in tanh's tails (frozen code dimensions)
    data_format: str = "auto"
    manifest: str = MANIFEST_NAME
    shard_sample_rate: int = 24000


class TranscribedMels(torch.utils.data.Dataset):
    """Item: ``{"mel": [n_mels, T] whisper log-mel, "labels": [n] int64, "truncated": bool}``."""

    def __init__(self, source: UtteranceSource, indices: Sequence[int], vocab: CharVocab, n_mels: int,
                 max_seconds: float) -> None:
        self.source, self.indices, self.vocab = source, list(indices), vocab
        self.n_mels = n_mels
        self.max_samples = int(max_seconds * WHISPER_SAMPLE_RATE)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, Any]:
        index = self.indices[i]
        wav, _ = self.source.load(index, WHISPER_SAMPLE_RATE)
        truncated = wav.shape[0] > self.max_samples
        mel = whisper_log_mel(wav[: self.max_samples], n_mels=self.n_mels)[0]
        labels = torch.tensor(self.vocab.encode(self.source.meta(index).text or ""), dtype=torch.long)
        return {"mel": mel, "labels": labels, "truncated": truncated}


def collate_mels(items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """-> ``mel [B, n_mels, T_max]`` (zero padded), ``mel_lengths [B]``, ``labels [B, L_max]`` (blank padded),
    ``label_lengths [B]``, ``truncated [B]`` bool."""
    mel_lengths = torch.tensor([it["mel"].shape[-1] for it in items])
    label_lengths = torch.tensor([it["labels"].shape[0] for it in items])
    mel = torch.zeros(len(items), items[0]["mel"].shape[0], int(mel_lengths.max()))
    labels = torch.full((len(items), max(1, int(label_lengths.max()))), BLANK, dtype=torch.long)
    for b, it in enumerate(items):
        mel[b, :, : it["mel"].shape[-1]] = it["mel"]
        labels[b, : it["labels"].shape[0]] = it["labels"]
    truncated = torch.tensor([bool(it["truncated"]) for it in items])
    return {"mel": mel, "mel_lengths": mel_lengths, "labels": labels, "label_lengths": label_lengths,
            "truncated": truncated}


def masked_mel_l1(pred: torch.Tensor, mel: torch.Tensor, mel_lengths: torch.Tensor) -> torch.Tensor:
    """Mean |pred - mel| over real frames: ``pred [B, n_mels, T2]`` (T2 = tokens x downsample <= T), ``mel
    [B, n_mels, T]``, ``mel_lengths [B]``."""
    t = pred.shape[-1]
    valid = (torch.arange(t, device=mel.device)[None, :] < mel_lengths[:, None]).unsqueeze(1).to(pred.dtype)
    diff = (pred.float() - mel[..., :t].float()).abs() * valid
    return diff.sum() / (valid.sum() * mel.shape[1]).clamp_min(1.0)


def code_statistics(ids: torch.Tensor, codebook_size: int) -> dict[str, float]:
    """Utilisation (fraction of ids used at least once) and perplexity (exp entropy) of the id histogram."""
    counts = torch.bincount(ids.flatten().to(torch.int64), minlength=codebook_size).double()
    p = counts / counts.sum().clamp(min=1)
    entropy = -(p[p > 0] * p[p > 0].log()).sum()
    return {"codebook_utilization": float((counts > 0).double().mean()), "code_perplexity": float(entropy.exp()),
            "codes_used": float((counts > 0).sum()), "tokens": float(counts.sum())}


@register
class SpeechTokenizerStage(CharVocabCheckpoint, TrainingStage):
    name = "tokenizer"

    def __init__(self, config: dict[str, Any], data_dir: Path) -> None:
        super().__init__(config, data_dir)
        self.train_cfg = TrainConfig.from_dict(config.get("train"))
        self.stage_cfg = dataclass_from_dict(TokenizerStageConfig, config.get("tokenizer"), "tokenizer")
        if "vocab_size" in self.stage_cfg.model:
            raise InputError("tokenizer.model.vocab_size is set from the training transcripts; remove it")
        self.base_cfg = SpeechTokenizerConfig.from_dict(self.stage_cfg.model)
        self._prepared = False

    def _prepare(self) -> None:
        """Open the data, split off the held-out utterances, build the vocabulary (deterministic: every rank and
        every resumed run gets the same)."""
        if self._prepared:
            return
        c = self.stage_cfg
        self.source = open_utterances(self.data_dir, c.data_format, c.manifest, c.shard_sample_rate)
        texts = [self.source.meta(i).text for i in range(len(self.source))]
        missing = [self.source.meta(i).id for i, t in enumerate(texts) if t is None]
        if missing:
            raise InputError(f"the tokenizer stage needs a transcript ('text') for every utterance; missing for "
                             f"{missing[:5]}{' ...' if len(missing) > 5 else ''}")
        self.train_idx, self.heldout_idx = heldout_split(len(self.source), c.heldout_fraction, c.split_seed)
        self.vocab = CharVocab.from_texts((texts[i] for i in self.train_idx), c.min_count, c.lowercase)
        self.cfg = SpeechTokenizerConfig.from_dict({**self.base_cfg.to_dict(), "vocab_size": len(self.vocab)})
        self._prepared = True

    def _items(self, indices: Sequence[int]) -> TranscribedMels:
        return TranscribedMels(self.source, indices, self.vocab, self.cfg.n_mels, self.cfg.max_seconds)

    def setup(self, device: torch.device, wrap: Wrap) -> None:
        self._prepare()
        self.device = torch.device(device)
        self.model = SupervisedSpeechTokenizer(self.cfg, reconstruct=self.stage_cfg.reconstruction_weight > 0)
        self.model = self.model.to(self.device).train()
        self.wrapped = wrap(self.model)
        self.opt = Optimization(self.model.parameters(), self.train_cfg.optim, self.train_cfg.max_steps)

    def dataset(self) -> TranscribedMels:
        self._prepare()
        return self._items(self.train_idx)

    def collate(self, items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return collate_mels(items)

    def train_step(self, batch: dict[str, torch.Tensor], step: int) -> dict[str, float]:
        mel = batch["mel"].to(self.device)
        out = self.wrapped(mel, batch["mel_lengths"].to(self.device))
        loss = F.ctc_loss(out.log_probs.transpose(0, 1), batch["labels"].to(self.device), out.lengths,
                          batch["label_lengths"].to(self.device), blank=BLANK, reduction="mean", zero_infinity=True)
        ctc = loss
        recon = torch.zeros(())
        if self.stage_cfg.reconstruction_weight > 0:
            recon = masked_mel_l1(out.mel, mel, batch["mel_lengths"].to(self.device))
            loss = ctc + self.stage_cfg.reconstruction_weight * recon
        if self.stage_cfg.saturation_weight > 0:
            loss = loss + self.stage_cfg.saturation_weight * out.saturation
        lr = self.opt.lr
        grad = self.opt.step(loss)
        valid = out.ids[out.ids >= 0]
        metrics = {"loss": float(loss.detach()), "ctc_loss": float(ctc.detach()), "mel_l1": float(recon.detach()),
                   "fsq_saturation": float(out.saturation.detach()),
                   "grad_norm": grad, "lr": lr,
                   "batch_code_utilization": float(valid.unique().numel() / self.cfg.codebook_size),
                   "truncated": float(batch["truncated"].sum())}
        if self.stage_cfg.eval_every > 0 and (step + 1) % self.stage_cfg.eval_every == 0:
            metrics.update(self.evaluate())
        return metrics

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Codebook statistics and CER on the held-out utterances (the first training ones if there are none),
        one utterance at a time. Keys are prefixed ``heldout_`` (or ``train_``)."""
        self._prepare()
        prefix, indices = ("heldout_", self.heldout_idx) if self.heldout_idx else ("train_", self.train_idx)
        items = self._items(indices[: self.stage_cfg.eval_max_utterances])
        was_training = self.model.training
        self.model.eval()
        all_ids, edits, chars = [], 0, 0
        for i in range(len(items)):
            batch = collate_mels([items[i]])
            out = self.model(batch["mel"].to(self.device), batch["mel_lengths"].to(self.device))
            all_ids.append(out.ids[out.ids >= 0].cpu())
            hyp = ctc_greedy(out.log_probs, out.lengths)[0]
            ref = batch["labels"][0, : int(batch["label_lengths"][0])].tolist()
            edits += edit_distance(hyp, ref)
            chars += len(ref)
        self.model.train(was_training)
        stats = code_statistics(torch.cat(all_ids), self.cfg.codebook_size)
        stats["cer"] = edits / max(chars, 1)
        stats["utterances"] = float(len(items))
        return {prefix + k: v for k, v in stats.items()}

    def export(self, out_dir: Path) -> None:
        """``speech_tokenizer.safetensors`` + ``speech_tokenizer.json`` with the evaluation figures in ``metadata``."""
        metrics = self.evaluate()
        metadata = {**json_metrics(metrics),
                    "codebook_size": self.cfg.codebook_size, "token_rate_hz": WHISPER_SAMPLE_RATE / WHISPER_HOP / self.cfg.downsample,
                    "mel_hop_samples": WHISPER_HOP, "asr_vocab": self.vocab.to_dict()}
        save_speech_tokenizer(self.model.tokenizer, out_dir, metadata)


class TrainedTokenExtractor:
    """A ``cadenza data`` feature extractor: the ``speech_tokens`` field (int32 ``[tokens]``, 25 Hz) from a trained
    tokenizer, in place of ``speech_tokenizer_v2.onnx``. On the command line:
    ``--extractor cadenza.training.speech_tokenizer_stage:speech_token_extractor=TOKENIZER_DIR``."""

    name, fields = "speech_tokens", ("speech_tokens",)

    def __init__(self, path: str | Path) -> None:
        self.tokenizer = load_speech_tokenizer(path)

    def __call__(self, utt: Any) -> dict[str, torch.Tensor]:
        log_mel = whisper_log_mel(utt.audio_at(WHISPER_SAMPLE_RATE), n_mels=self.tokenizer.config.n_mels)
        return {"speech_tokens": self.tokenizer(log_mel)[0].to(torch.int32)}


def speech_token_extractor(path: str) -> TrainedTokenExtractor:
    return TrainedTokenExtractor(path)
