"""CPU accounting for benchmarks that share the machine: processes, threads, the machine."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time

import pytest

from radixmesh.benchmarks.decode import sharing_bound
from radixmesh.benchmarks.proc_cpu import MACHINE, CpuMeter, cpu_seconds, machine_busy_seconds

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux /proc only")

SPIN = "import time\nend = time.perf_counter() + {s}\nwhile time.perf_counter() < end: pass\n"


def _spin(seconds: float, used: list[float] | None = None, hold: threading.Event | None = None) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    if used is not None:
        used.append(time.thread_time())  # this thread's own CPU seconds
    if hold is not None:
        hold.wait()  # NOTE: alive at the reading: an ended thread's time leaves /proc/<pid>/task


def test_a_busy_process_counts_its_cpu_and_a_sleeping_one_almost_none():
    busy = subprocess.Popen([sys.executable, "-c", SPIN.format(s=0.6)])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    try:
        time.sleep(0.15)  # past both interpreters' start
        meter = CpuMeter({"busy": busy.pid, "idle": idle.pid}, client=False)
        meter.start()
        time.sleep(0.3)
        share = meter.stop()
    finally:
        busy.wait()
        idle.wait()
    # NOTE: one spinning thread gets about a core, less on a loaded machine
    assert share.cores["busy"] > 0.15 and share.cores["idle"] < 0.05
    assert share.cores[MACHINE] >= share.cores["busy"] * 0.7  # NOTE: /proc/stat counts 10 ms ticks
    assert "client" not in share.cores


def test_every_thread_of_a_process_counts():
    before = cpu_seconds(os.getpid())
    used: list[float] = []
    hold = threading.Event()
    threads = [threading.Thread(target=_spin, args=(0.2, used, hold)) for _ in range(2)]
    for t in threads:
        t.start()
    while len(used) < 2:
        time.sleep(0.01)
    after = cpu_seconds(os.getpid())
    hold.set()
    for t in threads:
        t.join()
    assert after - before >= 0.95 * sum(used) > 0  # both threads' time


def test_the_client_is_this_process_and_besides_leaves_the_rest_of_the_machine():
    meter = CpuMeter({})
    meter.start()
    _spin(0.3)
    share = meter.stop()
    assert share.cores["client"] > 0.15
    rest = share.besides("client")
    assert rest == pytest.approx(share.cores[MACHINE] - share.cores["client"])


def test_a_process_that_is_gone_reads_nan():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert math.isnan(cpu_seconds(gone.pid))
    assert machine_busy_seconds() > 0


@pytest.mark.parametrize("others, threads, cores, bound", [
    (0.2, 2, 2, 0.9),    # both cores are the worker's: it keeps what the others leave
    (0.0, 2, 2, 1.0),
    (0.5, 2, 16, 1.0),   # free cores absorb the others
    (1.5, 1, 2, 0.5),
    (3.0, 2, 2, 0.0),
])
def test_the_sharing_bound(others, threads, cores, bound):
    assert sharing_bound(others, threads, cores) == pytest.approx(bound)
