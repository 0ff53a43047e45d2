"""The test plays tokenizer, cache index and scheduler on a real nats-server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from libs.protocol import Bus, ServiceError, Subjects, errors
from libs.protocol.messages import (
    AbortRequest, DetokRelease, EncodeReply, EncodeRequest, ErrorInfo, GatewayBatch,
    ReleaseRequest, RouteReply, RouteRequest, SubmitReply, SubmitRequest, TextDelta, Usage,
)
from services.gateway.pipeline import Pipeline, PipelineConfig

GATEWAY = "gw-test"
DETOK = "tok-1"
MODEL = "test-model"


@dataclass
class PlayedServices:
    """Answers encode/route/submit like the real services and streams output.

    ``mode`` picks what a submitted request produces:
    ``finish``: ``words`` deltas, the last with finish_reason ``length`` and usage;
    ``hang``: one delta, then nothing (client disconnects / timeouts);
    ``error``: one delta, then a finish with an ErrorInfo.
    """

    bus: Bus
    subjects: Subjects
    detok: str = DETOK
    mode: str = "finish"
    words: int = 4
    encode_error: ServiceError | None = None
    submit_errors: dict[str, ServiceError] = field(default_factory=dict)  # per worker
    workers: list[str] = field(default_factory=lambda: ["w1", "w2"])
    route_down: bool = False  # no cache index on the bus
    lost_workers: set[str] = field(default_factory=set)  # die after ``lost_after`` words
    lost_after: int = 0
    silent_submits: int = 0  # the first N submits are taken and never answered
    encodes: list[EncodeRequest] = field(default_factory=list)
    routes: list[RouteRequest] = field(default_factory=list)
    submits: list[SubmitRequest] = field(default_factory=list)
    aborts: list[AbortRequest] = field(default_factory=list)
    releases: list[ReleaseRequest] = field(default_factory=list)
    detok_releases: list[DetokRelease] = field(default_factory=list)
    _gateway_of: dict[str, str] = field(default_factory=dict)

    async def start(self) -> "PlayedServices":
        s, sub = self.subjects, self.bus.subscribe
        await sub(s.tokenizer_encode(), self._encode, EncodeRequest)
        if not self.route_down:
            await sub(s.index_route(), self._route, RouteRequest)
        await sub(s.index_release(), self._record(self.releases), ReleaseRequest)
        await sub(s.tokenizer_detok(DETOK), self._record(self.detok_releases), DetokRelease)
        for worker in self.workers:
            await sub(s.sched_submit(worker), self._submit_on(worker), SubmitRequest, concurrent=True)
            await sub(s.sched_abort(worker), self._record(self.aborts), AbortRequest)
        await self.bus.nc.flush()
        return self

    def _record(self, into: list):
        async def handler(msg) -> None:
            into.append(msg)
        return handler

    async def _encode(self, req: EncodeRequest) -> EncodeReply:
        self.encodes.append(req)
        if self.encode_error is not None:
            raise self.encode_error
        self._gateway_of[req.rid] = req.gateway
        ids = req.input_ids or list(range(1, 1 + len((req.text or "") + str(req.messages or ""))))
        return EncodeReply(input_ids=ids, max_new_tokens=req.max_new_tokens or 100,
                           detok_instance=DETOK, max_model_len=2048)

    async def _route(self, req: RouteRequest) -> RouteReply:
        self.routes.append(req)
        free = [w for w in self.workers if w not in req.exclude]
        if not free:
            raise errors.unavailable(f"no live worker serves model {req.model!r}")
        return RouteReply(worker_id=free[0], policy="first")

    def _submit_on(self, worker: str):
        async def submit(req: SubmitRequest) -> SubmitReply:
            self.submits.append(req)
            if len(self.submits) <= self.silent_submits:  # a scheduler dying with it
                await asyncio.Event().wait()
            if worker in self.submit_errors:
                raise self.submit_errors[worker]
            produce = self._lose if worker in self.lost_workers else self._produce
            asyncio.get_running_loop().create_task(produce(req))
            return SubmitReply(queue_position=0, session=f"{worker}-s1")
        return submit

    async def _lose(self, req: SubmitRequest) -> None:
        info = ErrorInfo(code="worker_lost", message="worker lost: no announce", status=503)
        await self._words(req, req.num_output_tokens, req.num_output_tokens + self.lost_after)
        await asyncio.sleep(0.02)
        await self.bus.publish(self.subjects.gateway_out(self._gateway_of[req.rid]), GatewayBatch(
            items=[TextDelta(rid=req.rid, text="", token_ids=[], finish_reason="error", error=info)]))

    async def _produce(self, req: SubmitRequest) -> None:
        out = self.subjects.gateway_out(self._gateway_of[req.rid])
        if self.mode in ("hang", "error"):
            await self.bus.publish(out, GatewayBatch(items=[TextDelta(rid=req.rid, text="a", token_ids=[7])]))
            if self.mode == "error":
                info = ErrorInfo(code="model_error", message="the worker died", status=502)
                await asyncio.sleep(0.02)
                await self.bus.publish(out, GatewayBatch(items=[
                    TextDelta(rid=req.rid, text="", token_ids=[], finish_reason="error", error=info)]))
            return
        await self._words(req, req.num_output_tokens, self.words)

    async def _words(self, req: SubmitRequest, start: int, end: int) -> None:
        """Words start..end-1 of the output ("w<i> "); the last word finishes it."""
        out = self.subjects.gateway_out(self._gateway_of[req.rid])
        prompt = len(req.input_ids) - req.num_output_tokens
        for i in range(start, min(end, self.words)):
            last = i == self.words - 1
            delta = TextDelta(
                rid=req.rid, text=f"w{i} ", token_ids=[100 + i],
                finish_reason="length" if last else None,
                usage=Usage(prompt_tokens=prompt, completion_tokens=self.words, cached_tokens=2)
                if last else None,
            )
            # a foreign rid in the same batch must be ignored
            await self.bus.publish(out, GatewayBatch(items=[delta, TextDelta(rid="other", text="x", token_ids=[1])]))
            await asyncio.sleep(0.005)

    async def wait_for(self, what: list, count: int = 1, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while len(what) < count:
                await asyncio.sleep(0.01)


@pytest.fixture()
async def bus(nats_server):
    bus = await Bus.connect(nats_server.url, "gateway-test")
    yield bus
    await bus.close()


@pytest.fixture()
async def played(bus, subject_prefix):
    return await PlayedServices(bus, Subjects(subject_prefix)).start()


@pytest.fixture()
async def pipeline(bus, subject_prefix):
    pipe = Pipeline(bus, Subjects(subject_prefix), GATEWAY, MODEL,
                    PipelineConfig(request_timeout=2.0, bus_timeout=2.0))
    await pipe.start()
    yield pipe
    await pipe.stop()
    assert pipe.open_requests == 0
