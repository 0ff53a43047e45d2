"""cache_index process: routes requests to live workers and books them in flight."""

from __future__ import annotations

from libs.protocol import errors
from libs.protocol.messages import (
    LoadReport, ReleaseRequest, RouteReply, RouteRequest, WorkersReply, WorkersRequest,
)
from libs.protocol.service import ServiceContext

from .policies import POLICIES
from .registry import Registry


class CacheIndex:
    def __init__(self, ctx: ServiceContext, policy: str, registry: Registry) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {sorted(POLICIES)}")
        self.ctx = ctx
        self.policy_name = policy
        self.policy = POLICIES[policy]()
        self.registry = registry

    async def start(self) -> None:
        s, bus = self.ctx.subjects, self.ctx.bus
        await bus.subscribe(s.index_load_all(), self._on_load, LoadReport)
        await bus.subscribe(s.index_route(), self._on_route, RouteRequest)
        await bus.subscribe(s.index_release(), self._on_release, ReleaseRequest)
        await bus.subscribe(s.index_workers(), self._on_workers, WorkersRequest)
        self.ctx.detail["policy"] = self.policy_name

    async def _on_load(self, report: LoadReport) -> None:
        self.registry.update(report)
        self.ctx.detail["workers"] = str(len(self.registry.live()))

    async def _on_route(self, req: RouteRequest) -> RouteReply:
        if req.num_tokens <= 0:
            raise errors.invalid_request("num_tokens must be positive")
        candidates = [s for s in self.registry.live(req.model)
                      if s.report.worker_id not in req.exclude]
        if not candidates:
            raise errors.unavailable(f"no live worker serves model {req.model!r}")
        chosen = self.policy(candidates, req.num_tokens, self.registry.clock())
        self.registry.book(chosen.report.worker_id, req.rid)
        return RouteReply(worker_id=chosen.report.worker_id, policy=self.policy_name)

    async def _on_release(self, msg: ReleaseRequest) -> None:
        self.registry.release(msg.worker_id, msg.rid)

    async def _on_workers(self, _: WorkersRequest) -> WorkersReply:
        return WorkersReply(workers=self.registry.summaries())
