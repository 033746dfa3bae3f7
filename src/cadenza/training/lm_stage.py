"""Stage ``lm``: train the text-speech LM with next-token cross-entropy on speech, eos and fill targets.

See docs/training.md, "Stage lm".

Config (``lm:`` section, ``LMStageConfig``)::

    lm:
      mix_probability: 0.5        # share of bistream (5:15 interleaved) sequences among items long enough for it
      speaker_tags: false         # mSFT: prefix "<speaker><|endofprompt|>" (needs the tokenizer)
      speaker_names: {}           # corpus speaker id -> tag name ("Speaker A"); unmapped -> unknown
      unknown_speaker: unknown
      unknown_speaker_probability: 0.0
      max_speech_tokens: 0        # skip longer items (0 = no limit)
      max_text_tokens: 0
      label_smoothing: 0.0        # the recipe uses none
      init_llm: null              # llm.pt or a model directory to start from (fine-tuning)
      init_reinit: []             # key prefixes kept fresh on that warm start (e.g. a new vocabulary's embeddings)
      init_qwen: null             # a HF Qwen2 checkpoint for the body (training from a text LLM)
      heldout_fraction: 0.0       # items kept out of training to measure generalisation (0: none)
      split_seed: 0
      eval_every: 0               # steps between held-out evaluations (heldout_ce, heldout_acc in metrics.jsonl)
      eval_max_items: 64
      export_best: false          # export the weights of the evaluation with the lowest heldout_ce, not the last
                                  # step's (llm.pt; the last step's go to llm_last.pt, the choice to best.json)

A small corpus is learned by heart long before the LM generalises (cadenza-tiny: training cross-entropy 0.36 while
it rose on unseen sentences), so for small data hold items out and keep the checkpoint where ``heldout_ce`` is lowest.

The loss is the token mean over the *global* batch (``distributed.global_mean_count``), so ``torchrun`` with N
processes equals one process with an N times larger batch. Per-item random choices (layout, random ``unknown``
tag) come from ``seeding.item_generator(seed, step, index)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cadenza.errors import InputError
from cadenza.models.cosyvoice2.lm import TIED_LM_HEAD_KEY, TextSpeechLM
from cadenza.training.checkpoint import atomic_torch_save
from cadenza.training.config import TrainConfig, dataclass_from_dict
from cadenza.training.distributed import global_mean_count
from cadenza.training.init_weights import load_component, load_qwen_body
from cadenza.training.lm_data import LMItems
from cadenza.training.lm_layout import LMBatch, LMSequence, build_sequence, pad_sequences
from cadenza.training.lm_model import LMForTraining, check_ids, targets_of
from cadenza.training.model_files import check_writable, resolve_model, write_model_config
from cadenza.training.optim import Optimization
from cadenza.training.seeding import item_generator
from cadenza.training.speaker_tags import SpeakerTagger
from cadenza.training.stage import TrainingStage, Wrap, register
from cadenza.training.wav_manifest import heldout_split

SALT_LAYOUT = 1


@dataclass(frozen=True)
class LMStageConfig:
    mix_probability: float = 0.5
    speaker_tags: bool = False
    speaker_names: dict | None = None
    unknown_speaker: str = "unknown"
    unknown_speaker_probability: float = 0.0
    max_speech_tokens: int = 0
    max_text_tokens: int = 0
    label_smoothing: float = 0.0
    init_llm: str | None = None
    init_reinit: tuple[str, ...] = ()  # key prefixes left freshly initialised on warm start (changed vocabulary)
    init_qwen: str | None = None
    heldout_fraction: float = 0.0
    split_seed: int = 0
    eval_every: int = 0
    eval_max_items: int = 64
    export_best: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.mix_probability <= 1 or not 0 <= self.label_smoothing < 1:
            raise InputError("lm: mix_probability must be in [0, 1] and label_smoothing in [0, 1)")
        if not 0 <= self.heldout_fraction < 1 or self.eval_every < 0 or self.eval_max_items < 1:
            raise InputError("lm: heldout_fraction must be in [0, 1), eval_every >= 0 and eval_max_items >= 1")
        if self.export_best and not (self.heldout_fraction > 0 and self.eval_every > 0):
            raise InputError("lm: export_best needs held-out items (heldout_fraction > 0) and eval_every > 0")
        if self.max_speech_tokens < 0 or self.max_text_tokens < 0:
            raise InputError("lm: max_speech_tokens / max_text_tokens must be >= 0")


def tied_llm_state(lm: TextSpeechLM) -> dict[str, torch.Tensor]:
    """``lm.state_dict()`` in the layout of the released ``llm.pt`` (see ``with_tied_lm_head``)."""
    return with_tied_lm_head({k: v.detach().cpu().contiguous() for k, v in lm.state_dict().items()})


def with_tied_lm_head(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A CPU state dict of the LM with the release's tied ``llm.model.lm_head.weight`` inserted after the Qwen body,
    i.e. the exact key names and order of the released ``llm.pt``. The head is the *same* tensor as
    ``embed_tokens`` (torch.save then stores it once); an existing head entry is replaced by that alias."""
    out: dict[str, torch.Tensor] = {}
    state = {k: v for k, v in state.items() if k != TIED_LM_HEAD_KEY}
    body = [k for k in state if k.startswith("llm.model.model.")]
    for k, v in state.items():
        out[k] = v
        if body and k == body[-1]:
            out[TIED_LM_HEAD_KEY] = state["llm.model.model.embed_tokens.weight"]
    return out


class LMStageBase(TrainingStage):
    """Model building, checkpoint state and ``llm.pt`` export shared by the ``lm`` and ``dpo`` stages."""

    section = "lm"
    config_class: type = LMStageConfig

    def __init__(self, config: dict[str, Any], data_dir: Path) -> None:
        super().__init__(config, data_dir)
        self.train_cfg = TrainConfig.from_dict(config.get("train"))
        self.cfg = dataclass_from_dict(self.config_class, config.get(self.section), self.section)
        self.source = resolve_model(config.get("model"))
        check_writable(self.source.config)
        self.lm_cfg = self.source.config.lm
        self.tokenizer = None
        if self.source.tokenizer_dir is not None:  # BPE files, or a phoneme table (cadenza-tiny and its fine-tunes)
            from cadenza.text.phonemes import PHONEMES_FILE, PhonemeTokenizer
            from cadenza.text.qwen_tokenizer import CosyVoice2Tokenizer

            phonemes = (self.source.tokenizer_dir / PHONEMES_FILE).is_file()
            self.tokenizer = (PhonemeTokenizer.from_dir(self.source.tokenizer_dir) if phonemes
                              else CosyVoice2Tokenizer(self.source.tokenizer_dir))
        self.tagger = None
        if self.cfg.speaker_tags:
            self.tagger = SpeakerTagger(self.tokenizer, self.cfg.speaker_names, self.cfg.unknown_speaker,
                                        self.cfg.unknown_speaker_probability)

    def build_lm(self) -> TextSpeechLM:
        lm = TextSpeechLM(self.lm_cfg)
        if self.cfg.init_llm:
            load_component(lm, self.cfg.init_llm, "llm.pt", self.cfg.init_reinit, f"{self.section}.init_llm")
        if self.cfg.init_qwen:
            load_qwen_body(lm, self.cfg.init_qwen)
        return lm

    def setup(self, device: torch.device, wrap: Wrap) -> None:
        self.device = device
        self.lm = self.build_lm().to(device).train()
        self.model = wrap(LMForTraining(self.lm))
        self.opt = Optimization(self.lm.parameters(), self.train_cfg.optim, self.train_cfg.max_steps)

    def collate(self, items: Sequence[Any]) -> list[dict[str, Any]]:
        return list(items)  # layouts are drawn in train_step, where the step (and so the random stream) is known

    def text_ids(self, item: dict[str, Any], draw: float) -> list[int]:
        tag = self.tagger.ids(item.get("speaker", ""), draw) if self.tagger is not None else []
        return tag + list(item["text_ids"])

    def sequence(self, item: dict[str, Any], text_ids: list[int], speech: list[int], draw: float) -> LMSequence:
        return build_sequence(text_ids, speech, self.lm_cfg.mix_ratio, self.lm_cfg.eos_id, self.lm_cfg.fill_id,
                              self.cfg.mix_probability, draw)

    def to_batch(self, seqs: Sequence[LMSequence]) -> LMBatch:
        batch = pad_sequences(seqs)
        check_ids(batch, self.lm_cfg.qwen.vocab_size, self.lm_cfg.speech_token_size)
        return batch.to(self.device)

    def state_dict(self) -> dict[str, Any]:
        return {"model": {k: v.detach().cpu() for k, v in self.lm.state_dict().items()}, "optim": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lm.load_state_dict(state["model"], strict=True)
        self.opt.load_state_dict(state["optim"])

    def export(self, out_dir: Path) -> None:
        out = Path(out_dir)
        atomic_torch_save(tied_llm_state(self.lm), out / "llm.pt")
        write_model_config(out, self.source.config, self.source.tokenizer_dir)


@register
class LMStage(LMStageBase):
    name = "lm"
    # With ``export_best``: {"step", "heldout_ce", "state"} of the best evaluation so far (kept in checkpoints).
    best: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.best is not None:
            state["best"] = self.best
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict({k: v for k, v in state.items() if k != "best"})
        self.best = state.get("best")

    def export(self, out_dir: Path) -> None:
        """``llm.pt``: the last step's weights, or with ``export_best`` the best evaluation's (the last step's then
        go to ``llm_last.pt`` and the choice to ``best.json``)."""
        super().export(out_dir)
        if self.best is None:
            return
        import json

        out = Path(out_dir)
        (out / "llm.pt").replace(out / "llm_last.pt")
        atomic_torch_save(with_tied_lm_head(self.best["state"]), out / "llm.pt")
        (out / "best.json").write_text(json.dumps({"step": self.best["step"],
                                                   "heldout_ce": self.best["heldout_ce"]}) + "\n")

    def _track_best(self, step: int, heldout: dict[str, float]) -> None:
        if not self.cfg.export_best or "heldout_ce" not in heldout:
            return
        if self.best is None or heldout["heldout_ce"] < self.best["heldout_ce"]:
            # Untied, as lm.state_dict() (the head is re-tied at export); .cpu() alone would alias CPU weights.
            state = {k: v.detach().cpu().clone() for k, v in self.lm.state_dict().items()}
            self.best = {"step": step, "heldout_ce": heldout["heldout_ce"], "state": state}

    def dataset(self) -> torch.utils.data.Dataset:
        """The training items: every usable item but the held-out ones (``heldout_fraction``)."""
        items = LMItems(self.data_dir, self.tokenizer, self.cfg.max_speech_tokens, self.cfg.max_text_tokens)
        train_idx, self.heldout_idx = heldout_split(len(items), self.cfg.heldout_fraction, self.cfg.split_seed)
        self.all_items = items
        return items if not self.heldout_idx else torch.utils.data.Subset(items, train_idx)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Teacher-forced cross-entropy and next-token accuracy on up to ``eval_max_items`` held-out items, in the
        unistream layout without speaker tags (what inference of plain text uses). Empty if nothing is held out."""
        if not getattr(self, "heldout_idx", None):
            return {}
        model = getattr(self.model, "module", self.model)  # not through DDP: every rank evaluates the same items
        was_training = model.training
        model.eval()
        total, correct, count = 0.0, 0, 0
        indices = self.heldout_idx[: self.cfg.eval_max_items]
        for start in range(0, len(indices), 16):
            items = [self.all_items[i] for i in indices[start : start + 16]]
            # draw 1.0 is never below mix_probability: the unistream layout
            seqs = [self.sequence(it, it["text_ids"], it["speech_tokens"], 1.0) for it in items]
            b = self.to_batch(seqs)
            select, targets, _ = targets_of(b)
            logits = model(b.kinds, b.ids, select).float()
            total += float(F.cross_entropy(logits, targets, reduction="sum"))
            correct += int((logits.argmax(-1) == targets).sum())
            count += targets.numel()
        model.train(was_training)
        return {"heldout_ce": total / count, "heldout_acc": correct / count, "heldout_items": float(len(indices))}

    def train_step(self, batch: list[dict[str, Any]], step: int) -> dict[str, float]:
        seqs = []
        for item in batch:
            layout_draw, tag_draw = torch.rand(2, generator=item_generator(self.train_cfg.seed, step, item["index"],
                                                                           SALT_LAYOUT)).tolist()
            seqs.append(self.sequence(item, self.text_ids(item, tag_draw), item["speech_tokens"], layout_draw))
        b = self.to_batch(seqs)
        select, targets, _ = targets_of(b)
        logits = self.model(b.kinds, b.ids, select)
        ce = F.cross_entropy(logits.float(), targets, reduction="sum", label_smoothing=self.cfg.label_smoothing)
        loss = ce / global_mean_count(targets.numel(), self.device)
        lr = self.opt.lr
        grad_norm = self.opt.step(loss)
        with torch.no_grad():
            acc = (logits.argmax(-1) == targets).float().mean()
        n_bi = sum(1 for s in seqs if s.targets.count(self.lm_cfg.fill_id) > 0)
        metrics = {"loss": float(loss.detach()), "acc": float(acc), "grad_norm": grad_norm, "lr": lr,
                   "tokens": float(targets.numel()), "bistream_frac": n_bi / len(seqs)}
        if self.cfg.eval_every > 0 and (step + 1) % self.cfg.eval_every == 0:
            heldout = self.evaluate()
            metrics.update(heldout)
            self._track_best(step + 1, heldout)
        return metrics
