"""GET /health: the gateway is healthy when it can reach a tokenizer and a worker."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from libs.protocol import Bus, Subjects
from libs.protocol.messages import Ping, Pong, WorkersReply, WorkersRequest


@dataclass(frozen=True)
class HealthReport:
    ok: bool
    body: dict


class BusHealth:
    """Checks the NATS link, one tokenizer ping and the cache index's worker count."""

    def __init__(self, bus: Bus, subjects: Subjects, timeout: float = 1.0) -> None:
        self.bus = bus
        self.subjects = subjects
        self.timeout = timeout

    async def __call__(self) -> HealthReport:
        if not self.bus.nc.is_connected:
            missing = ["nats: not connected"]
            return HealthReport(False, {"status": "unavailable", "missing": missing, "detail": missing[0]})
        pong, workers = await asyncio.gather(
            self.bus.request(self.subjects.ping("tokenizer"), Ping(), Pong, self.timeout),
            self.bus.request(self.subjects.index_workers(), WorkersRequest(), WorkersReply, self.timeout),
            return_exceptions=True,
        )
        missing: list[str] = []
        body: dict = {}
        if isinstance(pong, BaseException):
            missing.append(f"tokenizer: {pong}")
        else:
            body["tokenizer"] = pong.instance
        if isinstance(workers, BaseException):
            missing.append(f"cache_index: {workers}")
        else:
            body["workers"] = len(workers.workers)
            if not workers.workers:
                missing.append("workers: the cache index knows no live worker")
        status = {"status": "ok" if not missing else "unavailable"}
        if missing:
            status["missing"] = missing
            status["detail"] = "; ".join(missing)
        return HealthReport(not missing, {**status, **body})
