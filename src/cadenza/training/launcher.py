"""``train(stage, config, data, out)``: run one training stage, in one process or under ``torchrun``.

Loop (see ``cadenza.training.stage`` for the contract):

1. read the config (``train:`` -> ``TrainConfig``; the whole mapping goes to the stage, with ``train`` resolved);
2. join the process group if ``torchrun`` started us, pick the device, seed every RNG with ``seed`` so that all
   ranks build identical models, ``stage.setup(device, wrap)``, then reseed with ``seed + rank``;
3. batches: ``ResumableDistributedSampler`` (order = f(seed, epoch)) + ``DataLoader(collate=stage.collate)``;
4. ``--resume``: load the newest ``OUT/checkpoints/step_N.pt``, restore the stage and this rank's RNG states and
   continue at step N with the same data order (the sampler skips the epoch's first batches);
5. for each step: ``stage.train_step(batch, step)`` (``step`` = optimiser steps done before this one, 0-based;
   under ``mixed_precision: bf16`` on CUDA inside ``torch.autocast``); every ``log_every`` steps the metrics
   averaged over ranks go to ``OUT/metrics.jsonl`` / TensorBoard (logged ``step`` = steps done); a checkpoint every
   ``ckpt_every`` steps and at the end;
6. rank 0 calls ``stage.export(OUT)``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from cadenza.errors import CadenzaError, CheckpointError, InputError
from cadenza.training import distributed as D
from cadenza.training.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from cadenza.training.config import TrainConfig, check_sections, load_config_file
from cadenza.training.metrics import MetricsLogger
from cadenza.training.registry import STAGE_NAMES, get_stage
from cadenza.training.sampler import ResumableDistributedSampler
from cadenza.training.seeding import rng_state, seed_everything, set_rng_state
from cadenza.training.stage import TrainingStage

log = logging.getLogger(__name__)


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)


def _loader(stage: TrainingStage, cfg: TrainConfig, info: D.DistInfo) -> tuple[DataLoader, ResumableDistributedSampler]:
    dataset = stage.dataset()
    n = len(dataset)
    needed = cfg.batch_size * info.world_size
    if n < needed:
        raise InputError(
            f"the {stage.name} dataset has {n} items, fewer than one global batch "
            f"({cfg.batch_size} per process x {info.world_size} processes)"
        )
    sampler = ResumableDistributedSampler(dataset, info.world_size, info.rank, cfg.seed)
    generator = torch.Generator()
    loader = DataLoader(
        dataset, batch_size=cfg.batch_size, sampler=sampler, collate_fn=stage.collate, drop_last=True,
        num_workers=cfg.num_workers, generator=generator, pin_memory=info.device.type == "cuda",
        persistent_workers=False,
    )
    return loader, sampler


def cpu_has_native_bf16() -> bool:
    """True when the CPU multiplies bf16 in hardware (AMX or AVX512-BF16; Linux /proc/cpuinfo flags)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="ignore")
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype ``train.mixed_precision`` asks for on ``device`` (None: float32)."""
    if cfg.mixed_precision == "bf16":
        return torch.bfloat16
    if cfg.mixed_precision == "auto" and (device.type == "cuda" or cpu_has_native_bf16()):
        return torch.bfloat16
    return None


def _autocast(dtype: torch.dtype | None, device: torch.device):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _checkpoint(out: Path, stage: TrainingStage, step: int, cfg: TrainConfig, info: D.DistInfo) -> None:
    states = D.all_gather_objects(rng_state())  # every rank takes part; rank 0 writes
    state = stage.state_dict() if info.is_main or stage.collective_state else None
    if info.is_main:
        payload = {"stage": stage.name, "world_size": info.world_size, "train": cfg.to_dict(),
                   "state": state, "rng": states, "data": str(Path(stage.data_dir).resolve())}
        save_checkpoint(out, step, payload, keep=cfg.keep_checkpoints)
    D.barrier()


def _resume(out: Path, stage: TrainingStage, info: D.DistInfo) -> int:
    path = latest_checkpoint(out)
    if path is None:
        log.warning("--resume: no checkpoint in %s; starting from step 0", out / "checkpoints")
        return 0
    ckpt = load_checkpoint(path)
    if ckpt.get("stage") != stage.name:
        raise InputError(f"{path} is a checkpoint of stage {ckpt.get('stage')!r}, not {stage.name!r}")
    trained_on, data = ckpt.get("data"), str(Path(stage.data_dir).resolve())
    if isinstance(trained_on, str) and trained_on != data:  # a moved corpus is fine; another one breaks the data order
        log.warning("--resume: %s was written training on %s, and this run reads %s: if that is other data, the "
                    "resumed run does not continue the same epochs (start a new --out instead)", path, trained_on, data)
    hint = "delete it to resume from the one before" if len(list_checkpoints(out)) > 1 else "start a new --out"
    if not isinstance(ckpt["state"], dict):
        raise CheckpointError(f"{path}: its 'state' is a {type(ckpt['state']).__name__}, not a mapping ({hint})")
    try:
        stage.load_state_dict(ckpt["state"])
    except (KeyError, ValueError, TypeError, RuntimeError, AttributeError, IndexError) as exc:
        detail = str(exc).strip().splitlines()
        raise CheckpointError(f"{path} does not fit this {stage.name} model (written with another config, or "
                              f"damaged): {type(exc).__name__}: {' '.join(detail[:3])[:500]} ({hint})") from exc
    states = ckpt.get("rng") or []
    if isinstance(states, list) and len(states) == info.world_size:
        try:
            set_rng_state(states[info.rank])
        except (KeyError, ValueError, TypeError, RuntimeError, AttributeError, IndexError) as exc:
            raise CheckpointError(f"{path}: unreadable RNG state of rank {info.rank} ({type(exc).__name__}: "
                                  f"{str(exc)[:200]}; {hint})") from exc
    else:
        log.warning("checkpoint was written by %d processes, now %d: RNG states not restored", len(states),
                    info.world_size)
    log.info("resumed from %s (step %d)", path, ckpt["step"])
    return int(ckpt["step"])


def _check_finite(metrics: dict[str, float], step: int) -> None:
    if "loss" not in metrics:
        raise CadenzaError(f"train_step returned no 'loss' (got {sorted(metrics)})")
    if not math.isfinite(float(metrics["loss"])):
        raise CadenzaError(f"non-finite loss {metrics['loss']} at step {step + 1}: lower the learning rate or check the data")


def train(
    stage_name: str,
    config_path: str | Path,
    data_dir: str | Path,
    out_dir: str | Path,
    max_steps: int | None = None,
    resume: bool = False,
    config_overrides: dict[str, Any] | None = None,
) -> Path:
    """Train stage ``stage_name`` with the config file ``config_path`` on ``data_dir``; write to ``out_dir``.

    ``max_steps`` overrides ``train.max_steps``; ``config_overrides`` (top-level keys) replace sections of the file
    (tests, sweeps). Returns ``out_dir``.
    """
    config = load_config_file(config_path)
    config.update(config_overrides or {})
    stage_cls = get_stage(stage_name)
    check_sections(config, frozenset({"train", "model", *STAGE_NAMES, stage_cls.name,
                                      getattr(stage_cls, "section", stage_cls.name)}))
    cfg = TrainConfig.from_dict(config.get("train"), max_steps=max_steps)
    config["train"] = cfg.to_dict()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a folder")
    info = D.init_distributed(cfg.device)
    try:
        _run(stage_cls, config, Path(data_dir), out, cfg, info, resume)
    finally:
        D.cleanup(info)
    return out


def _run(stage_cls, config, data_dir: Path, out: Path, cfg: TrainConfig, info: D.DistInfo, resume: bool) -> None:
    seed_everything(cfg.seed)  # identical initial weights on every rank (and for any world size)
    stage = stage_cls(config, data_dir)
    stage.setup(info.device, D.make_wrap(info))
    seed_everything(cfg.seed + info.rank)
    loader, sampler = _loader(stage, cfg, info)
    created = info.is_main and not out.exists()
    if info.is_main:  # only once the config, the model and the data are known to be usable: no empty --out
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create the output folder {out}: {exc.strerror or exc}") from exc
    try:
        _train(stage, stage_cls, loader, sampler, out, cfg, info, resume)
    except BaseException:
        # A run that failed before its first checkpoint (a batch the model cannot take, say) leaves no folder it made.
        if created and latest_checkpoint(out) is None:
            shutil.rmtree(out, ignore_errors=True)
        raise


def _train(stage, stage_cls, loader, sampler, out: Path, cfg: TrainConfig, info: D.DistInfo, resume: bool) -> None:
    per_epoch = len(sampler) // cfg.batch_size
    if not resume and latest_checkpoint(out) is not None:
        raise InputError(f"{out} already holds checkpoints: pass --resume to continue, or use a new --out")
    start = _resume(out, stage, info) if resume else 0
    amp_dtype = autocast_dtype(cfg, info.device) if stage_cls.autocast else None
    if info.is_main:
        log.info("training %s on %s in %s (mixed_precision=%s%s)", stage_cls.name, info.device,
                 "float32" if amp_dtype is None else "bfloat16 autocast", cfg.mixed_precision,
                 "" if stage_cls.autocast else f"; the {stage_cls.name} stage always computes in float32")
    metrics_log = MetricsLogger(out, enabled=info.is_main, tensorboard=cfg.tensorboard)
    metrics_log.truncate_after(start)  # a fresh run starts a fresh file; a resumed one drops the steps it redoes
    bar = _progress(cfg.max_steps, start, cfg.progress and info.is_main)
    step, last_ckpt = start, start
    try:
        while step < cfg.max_steps:
            epoch, offset = divmod(step, per_epoch)
            sampler.set_epoch(epoch)
            sampler.set_start(offset * cfg.batch_size)
            if callable(getattr(loader.dataset, "set_epoch", None)):  # per-epoch random draws keyed on the epoch
                loader.dataset.set_epoch(epoch)
            loader.generator.manual_seed(cfg.seed * 1_000_003 + epoch)  # worker seeds independent of resume point
            tick = time.perf_counter()
            for batch in loader:
                with _autocast(amp_dtype, info.device):
                    metrics = dict(stage.train_step(batch, step))
                _check_finite(metrics, step)
                step += 1
                if step % cfg.log_every == 0 or step == cfg.max_steps:
                    metrics = D.mean_over_ranks(metrics, info.device)
                    now = time.perf_counter()
                    metrics_log.log(step, {**metrics, "epoch": epoch,
                                           "samples": step * cfg.batch_size * info.world_size,
                                           "step_time_s": now - tick})
                    if bar is not None:
                        bar.set_postfix(loss=f"{metrics['loss']:.4f}")
                tick = time.perf_counter()
                if bar is not None:
                    bar.update(1)
                if step % cfg.ckpt_every == 0:
                    _checkpoint(out, stage, step, cfg, info)
                    last_ckpt = step
                if step >= cfg.max_steps:
                    break
        if last_ckpt != step:
            _checkpoint(out, stage, step, cfg, info)
        if info.is_main or stage.collective_state:
            stage.export(out)
        D.barrier()
    finally:
        if bar is not None:
            bar.close()
        metrics_log.close()
