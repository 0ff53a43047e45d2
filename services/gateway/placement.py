"""Where a request runs: route it (the cache index, or the gateway's own load
view when the index cannot answer) and submit it to that worker's scheduler,
moving past workers whose scheduler refuses it with 503."""

from __future__ import annotations

import logging
from typing import Callable

import msgspec

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.extras import prefills_locally
from libs.protocol.messages import (
    AbortRequest, EncodeReply, ReleaseRequest, RouteReply, RouteRequest, SubmitReply, SubmitRequest,
)

from .config import PipelineConfig
from .controls import check_token_ids
from .fallback import LoadView
from .metrics import RequestMetrics
from .request import GenerationRequest, Resume

log = logging.getLogger("radixmesh.gateway.pipeline")


class Placement:
    """Routes and submits; ``publish_later`` sends the cleanup of a refused try."""

    def __init__(self, bus: Bus, subjects: Subjects, model: str, config: PipelineConfig,
                 metrics: RequestMetrics | None, publish_later: Callable[[str, object], None]) -> None:
        self.bus, self.subjects, self.model = bus, subjects, model
        self.config, self.metrics, self.publish_later = config, metrics, publish_later
        self.loads: LoadView | None = None  # set once the pipeline subscribes to loads
        # the router's (policy, predicted TTFT) per rid between routing and submit's return
        self.predicted: dict[str, tuple[str, float]] = {}
        self.pairs: dict[str, tuple[str, float]] = {}  # rid -> (prefill worker, predicted s)

    async def place(self, rid: str, req: GenerationRequest, enc: EncodeReply,
                    exclude: list[str], resume: Resume) -> tuple[str, str]:
        """Route and submit under ``rid``; returns (worker, scheduler session)."""
        exclude = list(exclude)
        check_token_ids(req, enc.vocab_size)
        sampling = msgspec.structs.replace(req.sampling(enc.max_new_tokens), seed=resume.seed)
        if resume.output_ids:  # NOTE: prompt logprobs went out with the first output
            sampling = msgspec.structs.replace(sampling, logprob_start_len=-1)
        submit = SubmitRequest(
            rid=rid, input_ids=enc.input_ids + resume.output_ids, sampling=sampling,
            detok_instance=enc.detok_instance, cache_salt=req.cache_salt,
            num_output_tokens=len(resume.output_ids),
        )
        local = prefills_locally(sampling, len(enc.input_ids), len(resume.output_ids))
        while True:
            worker = await self.route(rid, req, enc, exclude, local)
            # NOTE: a decode worker's prefill peer, named by the index (never twice the same try)
            submit.prefill_worker, submit.prefill_predicted_s = self.pairs.pop(rid, ("", 0.0))
            try:
                reply = await self.bus.request(self.subjects.sched_submit(worker), submit,
                                               SubmitReply, self.config.submit_timeout)
                return worker, reply.session
            except BaseException as exc:
                refused = isinstance(exc, ServiceError) and exc.code != "timeout"
                if not refused:  # the scheduler may hold it: make sure it lets go
                    self.publish_later(self.subjects.sched_abort(worker), AbortRequest(rid=rid))
                self.publish_later(self.subjects.index_release(), ReleaseRequest(rid=rid, worker_id=worker))
                exclude.append(worker)
                if isinstance(exc, ServiceError) and exc.code == "timeout":
                    raise ServiceError("submit_timeout", f"the scheduler of worker {worker} did not "
                                       f"accept request {rid} within {self.config.submit_timeout:g}s",
                                       503) from None
                if not (refused and exc.status == 503 and len(exclude) < self.config.route_attempts):
                    raise

    async def route(self, rid: str, req: GenerationRequest, enc: EncodeReply,
                     exclude: list[str], local_prefill: bool = False) -> str:
        """Ask the cache index; if it cannot answer, pick from our own load view."""
        route = RouteRequest(rid=rid, model=self.model, num_tokens=len(enc.input_ids),
                             exclude=exclude, input_ids=enc.input_ids, cache_salt=req.cache_salt,
                             max_new_tokens=enc.max_new_tokens, local_prefill=local_prefill)
        try:
            reply = await self._ask_index(route)
            if self.metrics is not None:
                self.metrics.routed(reply.policy, reply.worker_id)
            if reply.predicted_ttft_s > 0:
                self.predicted[rid] = (reply.policy, reply.predicted_ttft_s)
            if reply.prefill_worker:
                self.pairs[rid] = (reply.prefill_worker, reply.prefill_predicted_s)
            return reply.worker_id
        except ServiceError as exc:
            if exc.code not in ("service_unavailable", "timeout") or self.loads is None:
                raise
            worker = self.loads.pick(self.model, exclude)
            if worker is None:
                raise
            log.warning("cache index unavailable (%s): routed %s to least-loaded %s",
                        exc.message, rid, worker)
            if self.metrics is not None:
                self.metrics.routed("gateway_fallback", worker)
            return worker

    async def _ask_index(self, route: RouteRequest) -> RouteReply:
        """One replica of the cache index answers; one that dies holding the request leaves
        it unanswered, so a timeout asks again (another replica takes it)."""
        subject, timeout = self.subjects.index_route(), self.config.route_timeout
        for _ in range(self.config.index_attempts - 1):
            try:
                return await self.bus.request(subject, route, RouteReply, timeout)
            except ServiceError as exc:
                if exc.code != "timeout":
                    raise
                log.warning("route %s unanswered within %.1fs: asking the cache index again",
                            route.rid, timeout)
        return await self.bus.request(subject, route, RouteReply, timeout)
