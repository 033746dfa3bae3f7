"""``MachineLoad``: how many cores' worth of CPU other processes use, so a lone request takes every core only when
they are free (the VoxCPM 2 scheduler's lone worker).

Why: an op split over every core waits at its end for its slowest thread. When another process holds one of those
cores, that thread runs only when the OS gives it a slice, and every op waits for it: measured on two cores with
other busy processes, a mid-size LM decode step went from 3.4 ms on one thread to 100-290 ms on two
(docs/performance.md, "Tried and dropped: a lone request on every core"). One thread per worker is immune.

How: the machine's busy time (``/proc/stat``: everything but idle and iowait; a VM's stolen time counts as busy)
minus this process's CPU time (``os.times``), over windows of at least ``window_s``. Where ``/proc/stat`` cannot
be read (not Linux), the load is unknown and the engine does not widen.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def _machine_busy_seconds(stat: Path = PROC_STAT) -> float | None:
    """CPU seconds the whole machine has been busy since boot (all cores), or None when unknown."""
    try:
        with stat.open() as f:
            fields = f.readline().split()
        if not fields or fields[0] != "cpu":
            return None
        ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class MachineLoad:
    """``others()``: cores' worth of CPU used by other processes over the last window of at least ``window_s``
    seconds (None when unknown). The first window starts when the object is made; a call before it is complete
    waits for it (once), so the first request decides like the ones after it. Cheap to call often (one small file
    read per window); thread-safe."""

    def __init__(self, window_s: float = 0.25, stat: Path = PROC_STAT) -> None:
        self.window_s, self.stat = window_s, stat
        self._lock = threading.Lock()
        self._value: float | None = None
        self._last = self._sample()  # (wall, machine busy or None, own) at the window's start

    def _sample(self) -> tuple[float, float | None, float]:
        return time.monotonic(), _machine_busy_seconds(self.stat), _own_seconds()

    def others(self) -> float | None:
        with self._lock:
            start, busy0, own0 = self._last
            if busy0 is None:
                return None  # no /proc/stat (or unreadable): unknown for good
            waited = time.monotonic() - start
            if waited < self.window_s:
                if self._value is not None:
                    return self._value
                time.sleep(self.window_s - waited)  # the first window: complete it
            wall, busy, own = self._last = self._sample()
            if busy is None:
                self._value = None
                return None
            self._value = max(0.0, ((busy - busy0) - (own - own0)) / (wall - start))
            return self._value

    def idle(self, threshold: float = 0.3) -> bool:
        """Other processes used less than ``threshold`` of a core in the last window (False when unknown)."""
        value = self.others()
        return value is not None and value < threshold
