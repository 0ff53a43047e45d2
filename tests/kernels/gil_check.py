"""Whether a kernel call lets another Python thread run while it computes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def longest_stall(call: Callable[[], object], calls: int = 5) -> float:
    """The smallest, over ``calls`` calls, of the longest gap in a counting thread's ticks
    during the call, as a share of the call's time. With the GIL held it is ~1 (the other
    thread gets the GIL back only around the call, at the 5 ms switch interval)."""
    call()
    ticks: list[float] = []
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())

    other = threading.Thread(target=count)
    other.start()
    windows = []
    try:
        for _ in range(calls):
            start = time.perf_counter()
            call()
            windows.append((start, time.perf_counter()))
    finally:
        stop.set()
        other.join()

    def stall(a: float, b: float) -> float:
        seen = [a, *(t for t in ticks if a < t < b), b]
        return max(later - earlier for earlier, later in zip(seen, seen[1:])) / (b - a)

    return min(stall(a, b) for a, b in windows)
