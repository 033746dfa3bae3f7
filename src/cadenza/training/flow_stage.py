"""Stage ``flow``: conditional flow matching of the token-to-mel flow (docs/training.md, "Stage flow").

Per utterance (drawn from ``seeding.item_generator``, so reproducible across resumes and world sizes):

* the prompt: the first ``floor((1 - r) * frames)`` mel frames with ``r ~ U(mask_ratio)`` — the paper masks the
  final 70-100 % of the frames. The reference instead uses no prompt half of the time and otherwise
  ``randint(0, 0.3 * frames)`` prompt frames (``no_prompt_probability: 0.5`` reproduces that half);
* the loss covers the generated (non-prompt) frames only; the reference also counts the prompt frames, which the
  model can copy from ``cond`` (``loss_on_prompt: true`` for that);
* one attention mask kind per utterance, uniformly from ``attention_masks`` (the paper's four: non-causal,
  full-causal, chunk-M, chunk-2M). The reference has two (full or chunk-M) and draws one per *batch*;
* flow time ``t ~ U(0, 1)``, noise ``z ~ N(0, I)`` and classifier-free-guidance dropout (``mu``, speaker and
  ``cond`` zeroed with probability ``training_cfg_rate`` = 0.2 of the model config);
* speaking-rate pairs: an item whose corpus gives a ``speech_rate`` ``s`` (``recipes/tiny/aligned_corpus.py
  --speeds``) has audio read ``s`` x as fast as its tokens' timeline; its ``mu`` is resampled to the mel's
  ``ratio x tokens / s`` frames (flow_objective.py), which teaches the flow ``speed_method="flow"``.

Config (``flow:`` section)::

    flow:
      attention_masks: [full, causal, chunk, chunk2]
      mask_ratio: [0.7, 1.0]
      no_prompt_probability: 0.0
      loss_on_prompt: false
      min_tokens: 4              # shorter items are skipped
      max_tokens: 0              # longer items are skipped (0 = no limit)
      init_flow: null            # flow.pt or a model directory to start from
      init_reinit: []            # key prefixes kept fresh on that warm start (e.g. input_embedding. for a new vocabulary)
      init_grown: []             # prefixes of blocks init_flow lacks (a deeper model), started as the identity
                                 # (e.g. decoder.estimator.mid_blocks.2.; training/identity_blocks.py)
      freeze: []                 # key prefixes kept as loaded, not trained (e.g. [input_embedding., encoder.,
                                 # encoder_proj.]: the token -> mu side, when the tokens of new data are noisy)
      prior_weight: 0.0          # > 0: also fit the encoder's mu to the mel (MSE; Grad-TTS's encoder loss)
      average_decay: 0.0         # > 0: export an exponential moving average of the weights (e.g. 0.999, ~1,000
                                 # steps; training/parameter_average.py), as flow-matching and diffusion models
                                 # are commonly sampled; 0: the last step's weights
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from cadenza.data.dataset import ShardDataset
from cadenza.errors import InputError
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.training.checkpoint import atomic_torch_save
from cadenza.training.config import TrainConfig, dataclass_from_dict
from cadenza.training.distributed import global_mean_count
from cadenza.training.flow_objective import MASK_KINDS, FlowForTraining, chunk_sizes
from cadenza.training.identity_blocks import start_as_identity
from cadenza.training.init_weights import load_component
from cadenza.training.model_files import check_writable, resolve_model, write_model_config
from cadenza.training.optim import Optimization
from cadenza.training.parameter_average import ParameterAverage
from cadenza.training.seeding import item_generator
from cadenza.training.stage import TrainingStage, Wrap, register

log = logging.getLogger(__name__)
SALT_FLOW = 3


@dataclass(frozen=True)
class FlowStageConfig:
    attention_masks: tuple[str, ...] = MASK_KINDS
    mask_ratio: tuple[float, float] = (0.7, 1.0)
    no_prompt_probability: float = 0.0
    loss_on_prompt: bool = False
    min_tokens: int = 4
    max_tokens: int = 0
    init_flow: str | None = None
    init_reinit: tuple[str, ...] = ()  # key prefixes left freshly initialised on warm start (changed vocabulary)
    init_grown: tuple[str, ...] = ()  # blocks init_flow lacks, started as the identity (identity_blocks.py)
    freeze: tuple[str, ...] = ()  # key prefixes not trained (requires_grad off, not in the optimiser)
    prior_weight: float = 0.0  # > 0: + weight x MSE(mu, mel), a direct token -> mel signal (flow_objective.py)
    average_decay: float = 0.0  # > 0: export an exponential moving average of the weights (parameter_average.py)

    def __post_init__(self) -> None:
        if not self.attention_masks or any(k not in MASK_KINDS for k in self.attention_masks):
            raise InputError(f"flow.attention_masks must be a non-empty list of {MASK_KINDS}")
        lo, hi = self.mask_ratio
        if not 0 < lo <= hi <= 1:
            raise InputError("flow.mask_ratio must be [lo, hi] with 0 < lo <= hi <= 1")
        if not 0 <= self.no_prompt_probability <= 1 or self.min_tokens < 1 or self.max_tokens < 0:
            raise InputError("flow: need 0 <= no_prompt_probability <= 1, min_tokens >= 1, max_tokens >= 0")
        if not 0 <= self.average_decay < 1:
            raise InputError(f"flow.average_decay must be in [0, 1), got {self.average_decay}")
        if self.init_grown and not self.init_flow:
            raise InputError("flow.init_grown needs flow.init_flow (the shallower model the new blocks extend)")


class FlowItems(Dataset):
    """``[i] -> {"index", "tokens" [n], "mel" [f, mel], "spk" [spk_dim], "rate"}`` with tokens and mel cut to a
    common length: ``n = min(frames // ratio, tokens)`` and ``f = ratio * n`` (the frontend's rule for prompts); for
    an item stored with a ``speech_rate`` ``s`` != 1, ``n = min(tokens, floor(frames * s / ratio))`` and
    ``f = min(frames, round(ratio * n / s))``."""

    def __init__(self, data_dir: Path, ratio: int, min_tokens: int, max_tokens: int) -> None:
        self.base = ShardDataset(data_dir, ("speech_tokens", "mel", "spk_emb"), optional=("speech_rate",))
        self.ratio = ratio
        self.keep = []
        self.rates: dict[int, float] = {}
        short = long = 0
        for i in range(len(self.base)):
            shapes = self.base.shapes(i)
            rate = float(self.base.field(i, "speech_rate").reshape(-1)[0]) if "speech_rate" in shapes else 1.0
            if rate != 1.0:
                self.rates[i] = rate
            n, _ = self._lengths(shapes["speech_tokens"][0], shapes["mel"][0], rate)
            short, long = short + (n < min_tokens), long + bool(max_tokens and n > max_tokens)
            if n >= min_tokens and (not max_tokens or n <= max_tokens):
                self.keep.append(i)
        if not self.keep:
            raise InputError(f"no flow item of {data_dir} has between {min_tokens} and {max_tokens or 'any'} tokens")
        if long:  # a voice's longer recordings: said, not silently left out of its fine-tune
            log.warning("%d of %d items are longer than flow.max_tokens (%d speech tokens) and are skipped: raise "
                        "flow.max_tokens to train on them (memory grows with it), or cut the recordings",
                        long, len(self.base), max_tokens)
        if short:
            log.warning("%d of %d items are shorter than flow.min_tokens (%d) and are skipped", short, len(self.base),
                        min_tokens)

    def __len__(self) -> int:
        return len(self.keep)

    def _lengths(self, tokens: int, frames: int, rate: float) -> tuple[int, int]:
        """(tokens kept, mel frames kept) of an item (class docstring)."""
        if rate == 1.0:
            n = min(frames // self.ratio, tokens)
            return n, self.ratio * n
        n = min(tokens, int(frames * rate / self.ratio))
        return n, min(frames, round(self.ratio * n / rate))

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.base[self.keep[i]]
        rate = self.rates.get(self.keep[i], 1.0)
        n, f = self._lengths(item["speech_tokens"].shape[0], item["mel"].shape[0], rate)
        return {"index": i, "tokens": item["speech_tokens"][:n].long(), "mel": item["mel"][:f].float(),
                "spk": item["spk_emb"].float().reshape(-1), "rate": rate}


@register
class FlowStage(TrainingStage):
    name = "flow"

    def __init__(self, config: dict[str, Any], data_dir: Path) -> None:
        super().__init__(config, data_dir)
        self.train_cfg = TrainConfig.from_dict(config.get("train"))
        self.cfg = dataclass_from_dict(FlowStageConfig, config.get("flow"), "flow")
        self.source = resolve_model(config.get("model"))
        check_writable(self.source.config)
        self.flow_cfg = self.source.config.flow

    def setup(self, device: torch.device, wrap: Wrap) -> None:
        self.device = device
        flow = TokenToMelFlow(self.flow_cfg)
        if self.cfg.init_flow:
            load_component(flow, self.cfg.init_flow, "flow.pt", self.cfg.init_reinit + self.cfg.init_grown,
                           "flow.init_flow")
            if self.cfg.init_grown:
                log.info("%d new blocks start as the identity", start_as_identity(flow, self.cfg.init_grown))
        if self.cfg.freeze:
            names = [n for n, _ in flow.named_parameters()]
            unknown = [p for p in self.cfg.freeze if not any(n.startswith(p) for n in names)]
            if unknown:
                raise InputError(f"flow.freeze prefixes match no parameter of the flow: {unknown}")
            frozen = [p for n, p in flow.named_parameters() if n.startswith(tuple(self.cfg.freeze))]
            for p in frozen:
                p.requires_grad_(False)
            log.info("flow.freeze: %d of %d parameters kept as loaded", sum(p.numel() for p in frozen),
                     sum(p.numel() for p in flow.parameters()))
        self.flow = flow.to(device).train()
        self.model = wrap(FlowForTraining(self.flow, self.cfg.loss_on_prompt, self.cfg.prior_weight))
        self.opt = Optimization(self.flow.parameters(), self.train_cfg.optim, self.train_cfg.max_steps)
        self.average = ParameterAverage(self.flow, self.cfg.average_decay) if self.cfg.average_decay > 0 else None

    def dataset(self) -> Dataset:
        return FlowItems(self.data_dir, self.flow_cfg.token_mel_ratio, self.cfg.min_tokens, self.cfg.max_tokens)

    def collate(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """-> tokens ``[B, T]``, token_lens ``[B]``, mel ``[B, mel, F]``, spk, and ``frame_lens [B]`` when an item is
        a speaking-rate pair (``F = ratio * T`` otherwise)."""
        b, ratio = len(items), self.flow_cfg.token_mel_ratio
        t_max = max(it["tokens"].numel() for it in items)
        paired = any(it.get("rate", 1.0) != 1.0 for it in items)
        f_max = max(it["mel"].shape[0] for it in items) if paired else ratio * t_max
        mel_bins = items[0]["mel"].shape[1]
        tokens = torch.zeros(b, t_max, dtype=torch.long)
        mel = torch.zeros(b, mel_bins, f_max)
        for i, it in enumerate(items):
            tokens[i, : it["tokens"].numel()] = it["tokens"]
            mel[i, :, : it["mel"].shape[0]] = it["mel"].transpose(0, 1)
        batch = {"index": [it["index"] for it in items], "tokens": tokens, "mel": mel,
                 "token_lens": torch.tensor([it["tokens"].numel() for it in items]),
                 "spk": torch.stack([it["spk"] for it in items])}
        if paired:
            batch["frame_lens"] = torch.tensor([it["mel"].shape[0] for it in items])
        return batch

    def draws(self, batch: dict[str, Any], step: int) -> dict[str, torch.Tensor]:
        """Per-utterance random choices: prompt length, mask kind, t, z, CFG keep."""
        ratio, cfm = self.flow_cfg.token_mel_ratio, self.flow_cfg.cfm
        enc_chunk, est_chunk = self.flow_cfg.encoder.static_chunk_size, self.flow_cfg.estimator.static_chunk_size
        lo, hi = self.cfg.mask_ratio
        mel = batch["mel"]
        out: dict[str, list] = {k: [] for k in ("prompt_lens", "enc_chunks", "est_chunks", "t", "cfg_keep")}
        z = torch.zeros_like(mel)
        for i, index in enumerate(batch["index"]):
            g = item_generator(self.train_cfg.seed, step, index, SALT_FLOW)
            u_prompt, u_ratio, u_kind, t, u_cfg = torch.rand(5, generator=g).tolist()
            frames = int(batch["frame_lens"][i]) if "frame_lens" in batch else ratio * int(batch["token_lens"][i])
            r = lo + (hi - lo) * u_ratio
            prompt = 0 if u_prompt < self.cfg.no_prompt_probability else int(math.floor((1 - r) * frames))
            kind = self.cfg.attention_masks[min(int(u_kind * len(self.cfg.attention_masks)), len(self.cfg.attention_masks) - 1)]
            ec, sc = chunk_sizes(kind, enc_chunk, est_chunk)
            out["prompt_lens"].append(prompt)
            out["enc_chunks"].append(ec)
            out["est_chunks"].append(sc)
            out["t"].append(t)
            out["cfg_keep"].append(u_cfg > cfm.training_cfg_rate)
            z[i, :, :frames] = torch.randn(mel.size(1), frames, generator=g)
        res = {k: torch.tensor(v) for k, v in out.items()}
        res["z"] = z
        return res

    def train_step(self, batch: dict[str, Any], step: int) -> dict[str, float]:
        vocab, tokens = self.flow_cfg.vocab_size, batch["tokens"]  # on the host: on a GPU a bad id is a device assert
        low, high = (int(tokens.min()), int(tokens.max())) if tokens.numel() else (0, 0)
        if low < 0 or high >= vocab:
            bad = high if high >= vocab else low
            raise InputError(f"speech token id {bad} outside [0, {vocab}): the data does not fit the model (prepared "
                             "with another speech tokenizer than the one this flow's vocab_size is for?)")
        d = {k: v.to(self.device) for k, v in self.draws(batch, step).items()}
        loss, count = self.model(
            batch["tokens"].to(self.device), batch["token_lens"].to(self.device), batch["mel"].to(self.device),
            batch["spk"].to(self.device), d["prompt_lens"], d["enc_chunks"], d["est_chunks"], d["t"], d["z"],
            d["cfg_keep"], batch["frame_lens"].to(self.device) if "frame_lens" in batch else None,
        )
        # compute_loss averages over this rank's loss frames; rescale to the global average (see distributed.py)
        loss = loss * (count.detach().float() / global_mean_count(count, self.device))
        lr = self.opt.lr
        grad_norm = self.opt.step(loss)
        if self.average is not None:
            self.average.update(self.flow)
        return {"loss": float(loss.detach()), "grad_norm": grad_norm, "lr": lr, "frames": float(count)}

    def state_dict(self) -> dict[str, Any]:
        return {"model": {k: v.detach().cpu() for k, v in self.flow.state_dict().items()}, "optim": self.opt.state_dict(),
                **({"flow_average": self.average.state_dict()} if self.average is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.flow.load_state_dict(state["model"], strict=True)
        self.opt.load_state_dict(state["optim"])
        if self.average is not None:
            self.average.resume(state.get("flow_average"), self.flow)

    def export(self, out_dir: Path) -> None:
        """``flow.pt`` (the averaged weights with ``flow.average_decay``) + the model's config files."""
        out = Path(out_dir)
        flow = self.flow if self.average is None else self.average.averaged_module(self.flow)
        atomic_torch_save({k: v.detach().cpu().contiguous() for k, v in flow.state_dict().items()}, out / "flow.pt")
        write_model_config(out, self.source.config, self.source.tokenizer_dir)
