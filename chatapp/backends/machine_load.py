"""How many cores other processes keep busy, measured over a window of this process's life.

``CpuSample.now()`` reads the machine's CPU time (``/proc/stat``: every busy tick, steal included,
since a core the hypervisor gives to another guest is as lost as one a neighbour holds) and this
process's own CPU time (its threads and the children it waited for). Between two samples, the
busy time minus this process's own is what the others used: ``others_busy_cores`` turns it into
cores. Taken around a model load, the window costs nothing: the load's own work is subtracted.
Where ``/proc/stat`` cannot be read (not Linux), nothing is known and ``None`` comes back.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

MIN_WINDOW_S = 0.1  # a shorter window says too little (the kernel counts ticks of 10 ms)
_PROC_STAT = Path("/proc/stat")
_IDLE_FIELDS = (3, 4)  # idle, iowait in the "cpu" line (after the name)


@dataclass(frozen=True)
class CpuSample:
    """The machine's busy and total CPU seconds, this process's CPU seconds, and the clock."""

    machine_busy_s: float
    own_s: float
    wall_s: float

    @classmethod
    def now(cls, proc_stat: Path = _PROC_STAT) -> "CpuSample | None":
        """A sample now; None where the machine's CPU time cannot be read."""
        busy = _machine_busy_seconds(proc_stat)
        if busy is None:
            return None
        times = os.times()
        own = times.user + times.system + times.children_user + times.children_system
        return cls(busy, own, time.monotonic())


def _machine_busy_seconds(proc_stat: Path) -> float | None:
    try:
        with proc_stat.open() as file:
            fields = file.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(value) for value in fields[1:9]]  # user nice system idle iowait irq softirq steal
    busy = sum(value for i, value in enumerate(ticks) if i not in _IDLE_FIELDS)
    return busy / os.sysconf("SC_CLK_TCK")


def others_busy_cores(before: CpuSample | None, after: CpuSample | None = None,
                      proc_stat: Path = _PROC_STAT) -> float | None:
    """The cores other processes kept busy, on average, from ``before`` to ``after`` (default:
    now, waiting until the window is ``MIN_WINDOW_S`` long); None where unknown."""
    if before is None:
        return None
    if after is None:
        wait = MIN_WINDOW_S - (time.monotonic() - before.wall_s)
        if wait > 0:
            time.sleep(wait)
        after = CpuSample.now(proc_stat)
    if after is None or after.wall_s <= before.wall_s:
        return None
    others = (after.machine_busy_s - before.machine_busy_s) - (after.own_s - before.own_s)
    return max(0.0, others / (after.wall_s - before.wall_s))
