"""CPU time of processes (every thread counted) and of the whole machine, for benchmarks
that share a machine with what they measure.

Linux's ``/proc/<pid>/task/<tid>/schedstat`` gives each thread's time on a CPU in
nanoseconds (``/proc/<pid>/stat`` counts 10 ms ticks, too coarse for a step of a few
ms); ``/proc/stat`` gives the machine's busy time (user, nice, system, irq, softirq), in
ticks. Elsewhere, or for a process that is gone, the reading is NaN.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass


def cpu_seconds(pid: int) -> float:
    """Seconds on a CPU so far, summed over the threads alive now (a thread that ended is
    not counted: fine for services, whose threads live as long as they do); NaN if
    unreadable."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return math.nan
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # NOTE: a thread that ended between the listing and the read
    return total / 1e9


MACHINE = "machine"  # CpuMeter's name for every process on the machine together
_BUSY_FIELDS = (1, 2, 3, 6, 7)  # user nice system (idle iowait) irq softirq of /proc/stat's "cpu" line


def machine_busy_seconds() -> float:
    """Seconds all CPUs together have been busy since boot; NaN if unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return sum(int(fields[i]) for i in _BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return math.nan


@dataclass
class CpuShare:
    """CPU used over a window, by name, as a number of cores (1.0: one core busy)."""

    cores: dict[str, float]

    def besides(self, *names: str) -> float:
        """Cores the machine used beyond the processes ``names``."""
        return self.cores[MACHINE] - sum(self.cores[n] for n in names)


class CpuMeter:
    """``start()``, then ``stop()`` -> the cores each process used in between.

    ``pids`` maps names to process ids; ``"client"`` (this process, every thread, ended
    ones too: ``time.process_time``) is added unless ``client=False``, and
    :data:`MACHINE` (all processes) always."""

    def __init__(self, pids: dict[str, int], client: bool = True) -> None:
        self.pids = dict(pids)
        self.client = client
        self._t0 = 0.0
        self._c0: dict[str, float] = {}

    def start(self) -> None:
        self._c0 = self._read()
        self._t0 = time.perf_counter()

    def stop(self) -> CpuShare:
        wall = time.perf_counter() - self._t0
        now = self._read()
        return CpuShare({name: (now[name] - self._c0[name]) / wall for name in now})

    def _read(self) -> dict[str, float]:
        seconds = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        if self.client:
            seconds["client"] = time.process_time()
        seconds[MACHINE] = machine_busy_seconds()
        return seconds
