"""How much memory the streamed flow's caches of all requests together may hold (``SchedulerConfig.flow_cache_budget_mb``).

Why: the incremental flow keeps the estimator's keys and values of every frame it has made (at release size ~4.4 MiB
a frame in float32, 220 MiB per second of audio; half that in bfloat16), so a request's cache is bounded
(``StreamSchedule.flow_cache_limit_mb``), but many requests at once can still hold more than the machine has: eight
15 s sentences of the released model in float32 are ~30 GiB. Past the budget the largest caches are freed and their
requests go on recomputing the prefix per chunk (the same audio, slower), instead of the process running out of
memory. ``"auto"``: half of what is free on the model's device when the engine starts (``/proc/meminfo``
``MemAvailable`` on a CPU, ``torch.cuda.mem_get_info`` on CUDA); unknown there (not Linux): no bound.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

AUTO_SHARE = 0.5  # of the memory free at the start
PROC_MEMINFO = Path("/proc/meminfo")


def available_bytes(device: torch.device, meminfo: Path = PROC_MEMINFO) -> int | None:
    """Memory free for this process on ``device`` now, or None when unknown."""
    if device.type == "cuda":
        try:
            free, _total = torch.cuda.mem_get_info(device)
            return int(free)
        except (RuntimeError, AssertionError):
            return None
    if device.type != "cpu":
        return None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def flow_cache_budget(setting: float | str | None, device: torch.device, meminfo: Path = PROC_MEMINFO) -> int | None:
    """Bytes the flow caches of all requests may hold together: ``setting`` MiB, ``"auto"`` (``AUTO_SHARE`` of
    ``available_bytes``), or None (no bound)."""
    if setting is None:
        return None
    if setting == "auto":
        free = available_bytes(device, meminfo)
        if free is None:
            log.info("flow cache budget: free memory on %s unknown, no bound across requests", device)
            return None
        budget = int(free * AUTO_SHARE)
        log.info("flow cache budget: %.0f MiB across requests (half of the %.0f MiB free on %s)", budget / 2**20,
                 free / 2**20, device)
        return budget
    return int(float(setting) * 2**20)
