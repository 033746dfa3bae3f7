"""``MachineLoad``: how many cores' worth of CPU other processes use, so a lone request takes every core only when
they are free.

Why: a worker that runs its ops on every core (``WideLane``) waits at each op's end for its slowest thread. When
another process holds one of those cores, that thread runs only when the scheduler gives it a slice, and every op
waits for it: measured on two cores with two other busy processes, a mid-size LM step went from 3.4 ms on one
thread to 100-290 ms on two. One thread per worker (the split layout) is immune, so the engine widens only while
the rest of the machine is idle.

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
    seconds (None while unknown). Cheap to call often (one small file read per window); thread-safe."""

    def __init__(self, window_s: float = 0.25, stat: Path = PROC_STAT) -> None:
        self.window_s, self.stat = window_s, stat
        self._lock = threading.Lock()
        self._last: tuple[float, float, float] | None = None  # (wall, machine busy, own) at the window's start
        self._value: float | None = None

    def others(self) -> float | None:
        now = time.monotonic()
        with self._lock:
            if self._last is not None and now - self._last[0] < self.window_s:
                return self._value
            busy = _machine_busy_seconds(self.stat)
            own = _own_seconds()
            if busy is None:
                self._last, self._value = (now, 0.0, own), None
                return None
            if self._last is not None and self._last[1] > 0:
                wall = now - self._last[0]
                self._value = max(0.0, ((busy - self._last[1]) - (own - self._last[2])) / wall)
            self._last = (now, busy, own)
            return self._value

    def idle(self, threshold: float = 0.3) -> bool:
        """Other processes used less than ``threshold`` of a core in the last window (False while unknown)."""
        value = self.others()
        return value is not None and value < threshold
