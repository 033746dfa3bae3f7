"""Stage ``voxcpm2``: LoRA or full fine-tuning of a released VoxCPM 2 folder (docs/training.md, "Fine-tuning VoxCPM 2").

``cadenza train voxcpm2 --init MODEL_DIR --data DATA --out RUN`` (the CLI starts from ``default_config(mode)``, the
release's recipe, and lays a ``--config`` file over it). Config (``voxcpm2:`` section, ``VoxCPM2StageConfig``)::

    voxcpm2:
      init: /models/VoxCPM2        # the released folder (or --init; or model: {dir: ...})
      mode: lora                   # lora: only the adapters train | full: every weight but the AudioVAE's
      lora_r: 32                   # release defaults: rank 32, alpha 32, no dropout,
      lora_alpha: 32.0             # on both LMs' and the LocDiT's q/k/v/o projections,
      lora_lm: true                # not on the four bridge projections
      lora_dit: true
      lora_proj: false
      grad_accum_steps: 8          # train.batch_size is split into this many micro-batches (release: 16 = 2 x 8)
      manifest: manifest.jsonl     # in --data (or --data is the .jsonl itself)
      cache_dir: null              # latents; default: <manifest folder>/.voxcpm2_latents
      heldout_fraction: 0.0        # clips kept out of training; or val_manifest: a second manifest
      eval_every: 0                # steps between held-out losses (a multiple of train.log_every)
      activation_checkpointing: false  # recompute each transformer layer in the backward pass (less memory,
                                       # ~1/3 more compute; or --activation-checkpointing)
      fsdp: false                  # under torchrun: shard weights, gradients and optimiser state over the ranks
                                   # (FSDP2, one unit per transformer layer; sharding.py) instead of DDP

One optimiser step = the micro-batches' losses, each weighted by its share of the global batch's target patches
(``distributed.global_mean_count``), so N processes (and any micro-batch split) train like one batch. Each packed
row's random draws come from ``seeding.item_generator(seed, step, item)`` (``losses.ItemNoise``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cadenza.data.validate import DataLimits
from cadenza.errors import CheckpointError, InputError
from cadenza.models.voxcpm2 import lora as lora_ops
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.config import VoxCPM2Config
from cadenza.models.voxcpm2.loader import inspect_directory, load_model
from cadenza.models.voxcpm2.minicpm4 import set_activation_checkpointing
from cadenza.models.voxcpm2.model import VoxCPM2Model
from cadenza.models.voxcpm2.tokenizer import VoxCPM2Tokenizer
from cadenza.training import distributed as D
from cadenza.training.config import TrainConfig, dataclass_from_dict
from cadenza.training.optim import apply_config_after_resume, build_optimizer, build_scheduler
from cadenza.training.seeding import item_generator
from cadenza.training.stage import TrainingStage, Wrap, register
from cadenza.training.voxcpm2 import data as vx2_data
from cadenza.training.voxcpm2 import sharding
from cadenza.training.voxcpm2.export import write_lora_weights, write_model_dir
from cadenza.training.voxcpm2.losses import ItemNoise, voxcpm2_losses
from cadenza.training.voxcpm2.packer import EncodedSample, PackedBatch, VoxCPM2Packer
from cadenza.training.wav_manifest import heldout_split

log = logging.getLogger(__name__)
MODES = ("lora", "full")
SALT_TRAIN, SALT_EVAL = 11, 12
CACHE_NAME = ".voxcpm2_latents"


def default_config(mode: str = "lora") -> dict[str, Any]:
    """The reference trainer's recipe (its ``conf/voxcpm_v2/voxcpm_finetune_{lora,all}.yaml``): AdamW with weight
    decay 0.01, 100 warm-up steps then cosine to 0 at 1000 steps, lr 1e-4 (LoRA) / 1e-5 (full), gradient norm clipped
    at 1, 16 clips per step in micro-batches of 2, bf16 autocast where the hardware has it."""
    if mode not in MODES:
        raise InputError(f"voxcpm2.mode must be one of {MODES}, got {mode!r}")
    optim = {"optimizer": "adamw", "lr": 1e-4 if mode == "lora" else 1e-5, "weight_decay": 0.01,
             "schedule": "cosine", "warmup_steps": 100, "min_lr_ratio": 0.0, "grad_clip": 1.0}
    return {"train": {"batch_size": 16, "max_steps": 1000, "log_every": 10, "ckpt_every": 500,
                      "mixed_precision": "auto", "optim": optim},
            "voxcpm2": {"mode": mode, "grad_accum_steps": 8}}


@dataclass(frozen=True)
class VoxCPM2StageConfig:
    init: str | None = None
    mode: str = "lora"
    lora_r: int = 32
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_lm: bool = True
    lora_dit: bool = True
    lora_proj: bool = False
    grad_accum_steps: int = 1
    diff_weight: float = 1.0
    stop_weight: float = 1.0
    manifest: str = vx2_data.MANIFEST_NAME
    val_manifest: str | None = None
    cache_dir: str | None = None
    min_seconds: float = 0.5
    max_seconds: float = 30.0
    min_chars_per_second: float = 1.0
    max_chars_per_second: float = 40.0
    max_length: int = 0  # packed positions per clip; 0: the model's max_length
    heldout_fraction: float = 0.0
    split_seed: int = 0
    eval_every: int = 0
    eval_max_items: int = 64
    base_model: str | None = None  # lora_config.json's base_model (default: the init folder)
    activation_checkpointing: bool = False  # every layer of the four MiniCPM-4 stacks recomputed in the backward
    fsdp: bool = False  # under torchrun: FSDP2 sharding (sharding.py) instead of DDP; one process: no effect

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError(f"voxcpm2.mode must be one of {MODES}, got {self.mode!r}")
        if self.grad_accum_steps < 1 or self.max_length < 0 or self.eval_every < 0 or self.eval_max_items < 1:
            raise InputError("voxcpm2: grad_accum_steps >= 1, max_length >= 0, eval_every >= 0, eval_max_items >= 1")
        if not 0 <= self.heldout_fraction < 1:
            raise InputError("voxcpm2.heldout_fraction must be in [0, 1)")
        if min(self.diff_weight, self.stop_weight) < 0:
            raise InputError("voxcpm2: loss weights must be >= 0")
        try:
            self.limits()
            if self.mode == "lora":
                self.lora_config()
        except CheckpointError as exc:
            raise InputError(f"voxcpm2: {exc}") from exc

    def limits(self, sample_rate: int = 16000) -> DataLimits:
        return DataLimits(sample_rate=sample_rate, min_seconds=self.min_seconds, max_seconds=self.max_seconds,
                          min_chars_per_second=self.min_chars_per_second,
                          max_chars_per_second=self.max_chars_per_second)

    def lora_config(self) -> lora_ops.LoRAConfig:
        return lora_ops.LoRAConfig(enable_lm=self.lora_lm, enable_dit=self.lora_dit, enable_proj=self.lora_proj,
                                   r=self.lora_r, alpha=self.lora_alpha, dropout=self.lora_dropout)


class VoxCPM2ForTraining(nn.Module):
    """The losses as a forward pass (what DDP wraps): ``(batch, noise, progress) -> (diff, stop)`` scalars."""

    def __init__(self, model: VoxCPM2Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: PackedBatch, noise: ItemNoise, progress: float) -> tuple[torch.Tensor, torch.Tensor]:
        out = voxcpm2_losses(self.model, batch, progress, noise)
        return out.diff, out.stop


@dataclass
class MicroBatch:
    batch: PackedBatch  # [b, T] tracks
    indices: list[int]  # dataset positions (keys of the items' random streams)
    lengths: list[int]  # unpadded packed lengths


@register
class VoxCPM2Stage(TrainingStage):
    name = "voxcpm2"

    def __init__(self, config: dict[str, Any], data_dir: Path) -> None:
        super().__init__(config, data_dir)
        self.train_cfg = TrainConfig.from_dict(config.get("train"))
        self.cfg = dataclass_from_dict(VoxCPM2StageConfig, config.get("voxcpm2"), "voxcpm2")
        init = self.cfg.init or (config.get("model") or {}).get("dir")
        if not init:
            raise InputError("voxcpm2: give the VoxCPM 2 model folder to fine-tune (--init DIR or voxcpm2.init)")
        self.files = inspect_directory(init)
        self.model_config = VoxCPM2Config.from_json(self.files.config)
        self.vae_config = AudioVAEConfig.from_json(self.files.config)
        if self.train_cfg.batch_size % self.cfg.grad_accum_steps:
            raise InputError(f"train.batch_size {self.train_cfg.batch_size} is not a multiple of "
                             f"voxcpm2.grad_accum_steps {self.cfg.grad_accum_steps} (each step is split into that "
                             "many micro-batches; the release recipe: 16 and 8)")
        if self.cfg.eval_every and self.cfg.eval_every % self.train_cfg.log_every:
            raise InputError("voxcpm2.eval_every must be a multiple of train.log_every (held-out losses are logged "
                             "with the step's metrics)")
        self.max_length = min(self.cfg.max_length or self.model_config.max_length, self.model_config.max_length)
        self.tokenizer = VoxCPM2Tokenizer(self.files.tokenizer_dir, on_unknown="raise")
        self.eval_items: list[vx2_data.ClipItem] = []
        self.sharded = False  # FSDP: set by setup under torchrun

    # ------------------------------------------------------------------ model
    def setup(self, device: torch.device, wrap: Wrap) -> None:
        self.device = device
        model = load_model(self.files, device, torch.float32).train()
        set_activation_checkpointing(model, self.cfg.activation_checkpointing)
        if self.cfg.mode == "lora":
            self.lora_config = self.cfg.lora_config()
            lora_ops.apply_lora(model, self.lora_config)
            for name, p in model.named_parameters():
                p.requires_grad_(".lora_" in name)
            for m in lora_ops.lora_modules(model).values():  # the reference's init, from the (seeded) global RNG
                nn.init.kaiming_uniform_(m.lora_A, a=math.sqrt(5))
        self.model = model
        self.sharded = self.cfg.fsdp and D.is_distributed()
        if self.sharded:
            self.net = VoxCPM2ForTraining(model)
            layers = sharding.shard(self.net)
            log.info("voxcpm2.fsdp: %d transformer layers sharded over %d processes", layers, D.world_size())
        else:
            if self.cfg.fsdp:
                log.info("voxcpm2.fsdp: one process, nothing to shard")
            self.net = wrap(VoxCPM2ForTraining(model))
        self.params = [p for p in model.parameters() if p.requires_grad]  # after sharding: the sharded parameters
        self.optimizer = build_optimizer(self.params, self.train_cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, self.train_cfg.optim, self.train_cfg.max_steps)
        self.packer = VoxCPM2Packer(None, self.model_config.patch_size, self.model_config.feat_dim, self.max_length,
                                    special=self.model_config.special_tokens,
                                    frames_per_second=self.vae_config.frame_rate)
        n = sum(p.numel() for p in self.params)
        log.info("voxcpm2 %s fine-tuning: %d trainable parameters (%.2f%%)", self.cfg.mode, n,
                 100.0 * n / sum(p.numel() for p in model.parameters()))

    # ------------------------------------------------------------------ data
    def _cache(self, manifest: Path) -> vx2_data.LatentCache:
        root = Path(self.cfg.cache_dir) if self.cfg.cache_dir else manifest.parent / CACHE_NAME
        return vx2_data.LatentCache(root, self.files.audio_vae, self.model_config.patch_size)

    @torch.no_grad()
    def _extract(self, cache: vx2_data.LatentCache, clips: list[Path]) -> None:
        """Encode this rank's share of the clips not cached yet; every rank waits for all shares."""
        limits = self.cfg.limits(self.vae_config.sample_rate)
        rank, world = (torch.distributed.get_rank(), D.world_size()) if D.is_distributed() else (0, 1)
        todo = [c for i, c in enumerate(clips) if i % world == rank and cache.status(c, limits) == (None, None)]
        if todo:
            from cadenza.models.voxcpm2.audio_vae_loader import load_audio_vae
            from cadenza.models.voxcpm2.layouts import latents_to_patches

            vae = load_audio_vae(self.files.directory, device=self.device)
            step = self.model_config.patch_size * vae.hop_length

            def encode(wav: torch.Tensor) -> torch.Tensor:  # [n] -> [k, P, D], right-padded as the packer does
                wav = torch.nn.functional.pad(wav.float(), (0, -wav.numel() % step)).to(self.device)
                return latents_to_patches(vae.encode(wav[None], vae.sample_rate).float().cpu(),
                                          self.model_config.patch_size)

            from tqdm.auto import tqdm

            for clip in tqdm(todo, desc="AudioVAE latents", unit="clip", disable=rank != 0 or None):
                cache.extract(clip, limits, encode)
            del vae
        D.barrier()

    def _items(self, manifest: Path) -> tuple[list[vx2_data.ClipItem], vx2_data.LatentCache]:
        entries = vx2_data.read_manifest(manifest)
        cache = self._cache(manifest)
        self._extract(cache, vx2_data.clips_of(entries))
        items, rejected = vx2_data.select_items(
            entries, cache, self.cfg.limits(self.vae_config.sample_rate), self.tokenizer.encode,
            self.model_config.lm_config.vocab_size, self.max_length)
        if rejected:
            shown = "; ".join(f"{k}: {v}" for k, v in list(rejected.items())[:5])
            log.warning("%s: %d of %d clips skipped (%s%s)", manifest, len(rejected), len(entries), shown,
                        " ..." if len(rejected) > 5 else "")
        if not items:
            raise InputError(f"{manifest}: no usable clip ({'; '.join(list(rejected.values())[:3])})")
        return items, cache

    def dataset(self) -> torch.utils.data.Dataset:
        items, cache = self._items(vx2_data.manifest_path(self.data_dir, self.cfg.manifest))
        if self.cfg.val_manifest:
            self.eval_items, self.eval_cache = self._items(vx2_data.manifest_path(self.data_dir, self.cfg.val_manifest))
        elif self.cfg.heldout_fraction > 0:
            train_idx, held = heldout_split(len(items), self.cfg.heldout_fraction, self.cfg.split_seed)
            self.eval_items, self.eval_cache = [items[i] for i in held], cache
            items = [items[i] for i in train_idx]
        self.packer.dataset_count = max(e.entry.dataset_id for e in items + self.eval_items) + 1
        return vx2_data.VoxCPM2Items(items, cache)

    def _micro(self, items: Sequence[dict[str, Any]]) -> MicroBatch:
        samples = [EncodedSample(it["text_ids"], it["patches"], it["ref_patches"], it["is_prompt"], it["dataset_id"])
                   for it in items]
        batch = self.packer.pack(samples)
        lengths = (batch.position_ids.max(dim=1).values + 1).tolist()
        return MicroBatch(batch, [it["index"] for it in items], lengths)

    def collate(self, items: Sequence[dict[str, Any]]) -> list[MicroBatch]:
        """Items -> ``grad_accum_steps`` packed micro-batches (each padded to its own longest clip)."""
        size = max(1, len(items) // self.cfg.grad_accum_steps)
        return [self._micro(items[i : i + size]) for i in range(0, len(items), size)]

    # ------------------------------------------------------------------ step
    def _noise(self, micro: MicroBatch, step: int, salt: int) -> ItemNoise:
        gens = [item_generator(self.train_cfg.seed, step, i, salt) for i in micro.indices]
        return ItemNoise(gens, micro.lengths, micro.batch.text_tokens.shape[1])

    def train_step(self, batch: list[MicroBatch], step: int) -> dict[str, float]:
        progress = step / max(1, self.train_cfg.max_steps)  # the reference's curriculum input (step / num_iters)
        counts = [float(m.batch.loss_mask.sum()) for m in batch]
        denom = float(D.global_mean_count(sum(counts), self.device))
        self.optimizer.zero_grad(set_to_none=True)
        diff_sum = stop_sum = 0.0
        for k, micro in enumerate(batch):
            last = k == len(batch) - 1
            sync = self.net.no_sync() if not last and hasattr(self.net, "no_sync") else contextlib.nullcontext()
            with sync:
                diff, stop = self.net(micro.batch, self._noise(micro, step, SALT_TRAIN), progress)
                share = counts[k] / denom  # this micro-batch's part of the global mean
                loss = (self.cfg.diff_weight * diff + self.cfg.stop_weight * stop) * share
                loss.backward()
            diff_sum += float(diff.detach()) * share
            stop_sum += float(stop.detach()) * share
        lr = float(self.optimizer.param_groups[0]["lr"])
        clip = self.train_cfg.optim.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip if clip > 0 else float("inf"))
        grad_norm = float(sharding.full_tensor(norm, True) if self.sharded else norm)
        self.optimizer.step()
        self.scheduler.step()
        metrics = {"loss": self.cfg.diff_weight * diff_sum + self.cfg.stop_weight * stop_sum, "loss_diff": diff_sum,
                   "loss_stop": stop_sum, "grad_norm": grad_norm, "lr": lr, "target_patches": sum(counts)}
        done = step + 1
        if self.cfg.eval_every and (done % self.cfg.eval_every == 0 or done == self.train_cfg.max_steps):
            metrics.update(self.evaluate())
        return metrics

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Losses on up to ``eval_max_items`` held-out clips, with fixed draws (comparable across evaluations);
        every rank computes the same numbers. Empty when nothing is held out."""
        if not self.eval_items:
            return {}
        items = vx2_data.VoxCPM2Items(self.eval_items[: self.cfg.eval_max_items], self.eval_cache)
        size = max(1, self.train_cfg.batch_size // self.cfg.grad_accum_steps)
        self.model.eval()
        diff = stop = count = 0.0
        try:
            for start in range(0, len(items), size):
                micro = self._micro([items[i] for i in range(start, min(start + size, len(items)))])
                noise = self._noise(micro, 0, SALT_EVAL)
                if self.sharded:  # through the sharded root, which gathers its weights
                    d, s = self.net(micro.batch, noise, 1.0)
                else:
                    out = voxcpm2_losses(self.model, micro.batch, 1.0, noise)
                    d, s = out.diff, out.stop
                n = float(micro.batch.loss_mask.sum())
                diff, stop, count = diff + float(d) * n, stop + float(s) * n, count + n
        finally:
            self.model.train()
        count = max(count, 1.0)
        return {"heldout_loss": (self.cfg.diff_weight * diff + self.cfg.stop_weight * stop) / count,
                "heldout_diff": diff / count, "heldout_stop": stop / count, "heldout_items": float(len(items))}

    # ------------------------------------------------------------------ state
    @property
    def collective_state(self) -> bool:
        """Sharded: ``state_dict`` and ``export`` gather the weights, so every rank calls them (rank 0 writes)."""
        return self.sharded

    def _weights(self) -> dict[str, torch.Tensor]:
        """The trained weights, whole, on the CPU (sharded: a collective; empty on ranks other than 0)."""
        state = lora_ops.lora_state_dict(self.model) if self.cfg.mode == "lora" else self.model.state_dict()
        if self.sharded:
            return sharding.full_state(state, torch.distributed.get_rank() == 0)
        return {k: v.detach().cpu().clone() for k, v in state.items()}

    def state_dict(self) -> dict[str, Any]:
        if self.sharded:
            optimizer = sharding.full_optimizer_state(self.optimizer, torch.distributed.get_rank() == 0)
        else:
            optimizer = self.optimizer.state_dict()
        return {"mode": self.cfg.mode, "model": self._weights(), "optimizer": optimizer,
                "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("mode") != self.cfg.mode:
            raise ValueError(f"the checkpoint is of a {state.get('mode')} run, this one is {self.cfg.mode}")
        weights, optimizer = state["model"], state["optimizer"]
        if self.sharded:  # the checkpoint holds whole tensors: keep this rank's shards
            weights = sharding.sharded_state(weights, self.model)
            in_order = [p for group in self.optimizer.param_groups for p in group["params"]]  # the state's indices
            optimizer = sharding.sharded_optimizer_state(optimizer, in_order)
        if self.cfg.mode == "lora":
            lora_ops.load_lora_state_dict(self.model, weights, "checkpoint")
        else:
            self.model.load_state_dict(weights, strict=True)
        self.optimizer.load_state_dict(optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        apply_config_after_resume(self.optimizer, self.scheduler, self.train_cfg.optim)

    def export(self, out_dir: Path) -> None:
        """LoRA: ``lora_weights.safetensors`` + ``lora_config.json``; full: a release-layout model folder (float32
        weights) — both in ``out_dir``. Sharded: every rank calls this, rank 0 writes."""
        if self.sharded:
            weights = self._weights()
            if torch.distributed.get_rank() != 0:
                return
        else:
            weights = lora_ops.lora_state_dict(self.model) if self.cfg.mode == "lora" else self.model.state_dict()
        if self.cfg.mode == "lora":
            write_lora_weights(weights, self.lora_config, out_dir, self.cfg.base_model or str(self.files.directory))
        else:
            write_model_dir(weights, self.files, out_dir, torch.float32)
