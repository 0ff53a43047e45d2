"""The workers' idle fraction over one run, from the gateway's ``/metrics``.

Each scheduler counts, per worker, the wall time while steps were queued or
running (``radixmesh:worker_active_seconds``) and the worker's forward time
within it (``radixmesh:worker_busy_seconds``); the gateway exports both. Two
scrapes around a run give the share of that run the workers waited.
"""

from __future__ import annotations

import math

import httpx

BUSY = "radixmesh:worker_busy_seconds"
ACTIVE = "radixmesh:worker_active_seconds"


async def scrape(http: httpx.AsyncClient) -> tuple[float, float] | None:
    """(busy, active) seconds summed over the gateway's workers; None if unavailable."""
    try:
        resp = await http.get("/metrics")
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return parse(resp.text)


def parse(text: str) -> tuple[float, float] | None:
    totals = {BUSY: 0.0, ACTIVE: 0.0}
    found = False
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
            found = True
    return (totals[BUSY], totals[ACTIVE]) if found else None


def idle_fraction(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float:
    """Share of the active time between the scrapes the workers waited; NaN if unknown."""
    if before is None or after is None or after[1] - before[1] <= 0:
        return math.nan
    return max(0.0, 1.0 - (after[0] - before[0]) / (after[1] - before[1]))
