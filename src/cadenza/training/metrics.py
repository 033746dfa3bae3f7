"""Training metrics: ``OUT/metrics.jsonl`` (one JSON object per logged step) and TensorBoard when installed.

Only rank 0 writes. Each line holds ``step`` (optimiser steps done), ``loss`` and whatever else the stage returned,
plus the launcher's bookkeeping (``epoch``, ``samples``, ``step_time_s``). On ``--resume`` the lines after
the checkpoint's step are dropped, so the file reads as one uninterrupted run. TensorBoard (``pip install
'cadenza[train]'``) logs to ``OUT/tensorboard``; without it that part is skipped quietly.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def read_metrics(out_dir: str | Path) -> list[dict]:
    path = Path(out_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _json_number(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)  # JSON has no NaN/inf


class MetricsLogger:
    def __init__(self, out_dir: str | Path, enabled: bool = True, tensorboard: bool = True) -> None:
        self.path = Path(out_dir) / METRICS_FILE
        self.enabled = enabled
        self._writer = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # the optional `train` extra is not installed
                log.debug("tensorboard not installed; logging to %s only", self.path)
            else:
                self._writer = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard"))

    def truncate_after(self, step: int) -> None:
        """Drop logged lines with ``step > step`` (a resumed run rewrites them)."""
        if not self.enabled or not self.path.is_file():
            return
        kept = [r for r in read_metrics(self.path.parent) if int(r.get("step", 0)) <= step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **{k: _json_number(float(v)) for k, v in metrics.items() if k != "step"}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self._writer is not None:
            for k, v in metrics.items():
                self._writer.add_scalar(f"train/{k}", float(v), step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
