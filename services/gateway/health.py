"""GET /health: the gateway can serve when it reaches a tokenizer and a worker.

``ok``: every worker seen by an earlier check is still there. ``degraded`` (still
200): generations are served, but a worker seen within ``forget_s`` is gone (it
died and may be restarting) or the cache index is unreachable (the gateway routes
by its own view of worker load). ``unavailable`` (503): no tokenizer, no worker
or no broker; ``missing`` says which.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from libs.protocol import Bus, Subjects
from libs.protocol.messages import Ping, Pong, WorkerInfo, WorkersReply, WorkersRequest

if TYPE_CHECKING:
    from .fallback import LoadView


@dataclass(frozen=True)
class HealthReport:
    ok: bool
    body: dict


class BusHealth:
    """Checks the NATS link, one tokenizer ping and the cache index's worker list
    (or, with the index down, ``loads``: the gateway's own view)."""

    def __init__(self, bus: Bus, subjects: Subjects, timeout: float = 1.0,
                 loads: LoadView | None = None, forget_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.bus = bus
        self.subjects = subjects
        self.timeout = timeout
        self.loads = loads
        self.forget_s = forget_s
        self.clock = clock
        self._seen: dict[str, float] = {}  # worker id -> when a check last saw it
        self._left: set[str] = set()  # workers that said they stop: not lost

    async def watch(self) -> None:
        """Hear workers that stop on purpose (their last announce), so they are not reported lost."""
        async def on_announce(info: WorkerInfo) -> None:
            if info.leaving:
                self._left.add(info.worker_id)
                self._seen.pop(info.worker_id, None)
            else:  # NOTE: back (a restart under its id): watched again
                self._left.discard(info.worker_id)

        await self.bus.subscribe(self.subjects.worker_announce(), on_announce, WorkerInfo)

    async def __call__(self) -> HealthReport:
        if not self.bus.nc.is_connected:
            missing = ["nats: not connected"]
            return HealthReport(False, {"status": "unavailable", "missing": missing, "detail": missing[0]})
        pong, listed = await asyncio.gather(
            self.bus.request(self.subjects.ping("tokenizer"), Ping(), Pong, self.timeout),
            self.bus.request(self.subjects.index_workers(), WorkersRequest(), WorkersReply, self.timeout),
            return_exceptions=True,
        )
        missing: list[str] = []
        degraded: list[str] = []
        body: dict = {}
        if isinstance(pong, BaseException):
            missing.append(f"tokenizer: {pong}")
        else:
            body["tokenizer"] = pong.instance
        if isinstance(listed, BaseException):
            workers = [r.worker_id for r in self.loads.live()] if self.loads is not None else []
            if workers:
                degraded.append(f"cache_index: {listed} (routing by the gateway's own load view)")
            else:
                missing.append(f"cache_index: {listed}")
        else:
            workers = [w.worker_id for w in listed.workers]
            if not workers:
                missing.append("workers: the cache index knows no live worker")
        if workers or not isinstance(listed, BaseException):
            body["workers"] = len(workers)
        degraded += self._lost(workers)
        if missing:
            status = {"status": "unavailable", "missing": missing, "detail": "; ".join(missing)}
        elif degraded:
            status = {"status": "degraded", "degraded": degraded, "detail": "; ".join(degraded)}
        else:
            status = {"status": "ok"}
        broker = self.bus.broker()  # NOTE: which node of the cluster this gateway is on, of how many
        body["nats"] = {"server": broker["nats_server"], "url": broker["nats_url"],
                        "nodes": int(broker["nats_nodes"])}
        return HealthReport(not missing, {**status, **body})

    def _lost(self, workers: list[str]) -> list[str]:
        """Workers an earlier check saw (within ``forget_s``) that are gone now."""
        now = self.clock()
        self._seen = {w: t for w, t in self._seen.items() if now - t <= self.forget_s}
        lost = [f"worker {w}: gone since a check {now - t:.0f}s ago (restarting or removed)"
                for w, t in sorted(self._seen.items()) if w not in workers]
        self._seen.update(dict.fromkeys(set(workers) - self._left, now))
        return lost
