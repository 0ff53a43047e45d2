"""The request pipeline: encode -> route -> submit, then text deltas back.

No HTTP in here; the gateway's routes and a benchmark client both drive it::

    pipeline = Pipeline(bus, subjects, instance="gw-1", model="SmolLM2-135M-Instruct")
    await pipeline.start()                      # subscribes gw.<instance>.out once
    gen = await pipeline.submit(GenerationRequest(text="hi", max_new_tokens=8))
    async with gen:                             # aborts on exit if unfinished
        async for delta in gen:                 # merged TextDeltas, last has finish_reason
            ...
    await pipeline.stop()

Failures are raised as :class:`ServiceError` (typed, with an HTTP status).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
import uuid

from opentelemetry import trace
from opentelemetry.trace import Span, StatusCode

from libs.protocol import Bus, ServiceError, Subjects, errors, tracing
from libs.protocol.limits import WORKER_LIVENESS_S
from libs.protocol.messages import (
    AbortRequest, DetokRelease, EncodeReply, EncodeRequest, GatewayBatch, ReleaseRequest, TextDelta,
)

from .config import PipelineConfig
from .fallback import LoadView
from .generation import Completion, DeltaQueue, Generation
from .metrics import RequestMetrics
from .observability import request_arrival
from .placement import Placement
from .request import GenerationRequest, Launched, Resume
from .stall import Arrivals, short_output
from .tokenizers import TokenizerView

__all__ = ["Completion", "Generation", "GenerationRequest", "Pipeline", "PipelineConfig"]

EXCLUDED_RETRY_S = 1.0
STALE_AFTER_RECONNECT_S = 5.0
log = logging.getLogger("radixmesh.gateway.pipeline")
_tracer = trace.get_tracer("radixmesh.gateway")


class Pipeline:
    """Runs requests through the services; one instance per gateway process."""

    def __init__(self, bus: Bus, subjects: Subjects, instance: str, model: str,
                 config: PipelineConfig = PipelineConfig(),
                 metrics: RequestMetrics | None = None) -> None:
        self.bus = bus
        self.metrics = metrics
        self.subjects = subjects
        self.instance = instance
        self.model = model
        self.placement = Placement(bus, subjects, model, config, metrics, self._publish_later)
        # NOTE: every rid in here has exactly one live Generation (or a submit in
        # progress); it is removed synchronously when that ends, so none leak.
        self._queues: dict[str, DeltaQueue] = {}
        self._tasks: set[asyncio.Task] = set()
        self._live: set[Generation] = set()  # open generations, for the watchdog
        self.submitted = 0  # requests accepted since start
        self.arrivals = Arrivals()
        self._stall_watch: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None
        self._tokenizer_watch: asyncio.Task | None = None
        self.tokenizers: TokenizerView | None = None
        self._sub = None
        self.loads: LoadView | None = None

    @property
    def config(self) -> PipelineConfig:
        return self.placement.config

    @config.setter
    def config(self, config: PipelineConfig) -> None:
        self.placement.config = config

    @property
    def open_requests(self) -> int:
        return len(self._queues)

    async def start(self) -> None:
        """Subscribe once to this instance's output subject (and to worker loads)."""
        self._sub = await self.bus.subscribe(
            self.subjects.gateway_out(self.instance), self._dispatch, GatewayBatch
        )
        self.loads = self.placement.loads = LoadView()
        await self.loads.start(self.bus, self.subjects)
        self._watchdog = asyncio.create_task(self._watch(), name="gateway-watchdog")
        self.tokenizers = TokenizerView(self.bus, self.subjects)
        self._tokenizer_watch = asyncio.create_task(self._watch_tokenizers(), name="gateway-tokenizers")
        self._stall_watch = asyncio.create_task(self._watch_stalls(), name="gateway-stalls")

    async def stop(self) -> None:
        """Unsubscribe and wait for pending abort/release messages to go out."""
        for task in (self._watchdog, self._tokenizer_watch, self._stall_watch):
            if task is not None:
                task.cancel()
        self._watchdog = self._tokenizer_watch = self._stall_watch = None
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        await self.drain()

    async def _watch(self) -> None:
        """End open requests whose scheduler is gone, so they resume elsewhere
        (a dead worker is reported by its scheduler; a dead scheduler by no one),
        and every open request when the broker connection drops: output sent
        meanwhile is lost, so they could only stall or skip text (503 instead)."""
        while True:
            await asyncio.sleep(self.config.watch_interval)
            if not self.bus.nc.is_connected:
                # NOTE: output sent meanwhile may be lost, a final delta too (no later delta
                # would show the gap): resume every open request once the bus is back
                for gen in list(self._live):
                    gen.lost(errors.stream_gap(f"{self.subjects.gateway_out(self.instance)}: "
                                               "the broker connection dropped"))
                continue
            for gen in list(self._live):
                reason = self.loads.lost(gen.worker_id, gen.session, gen.bound_at)
                if reason is not None and not gen.finished:
                    log.warning("request %s: %s", gen.rid, reason)
                    gen.lost(ServiceError("scheduler_lost", reason, 503))

    async def _watch_tokenizers(self) -> None:
        """End open requests whose detokenizing tokenizer is gone, so they resume
        through another one (on the same worker). NOTE: it probes when no request
        is open too, so the view knows an instance before one of its requests needs it."""
        assert self.tokenizers is not None
        while True:
            await asyncio.sleep(self.config.tokenizer_probe_interval)
            open_on = {gen.detok_instance for gen in self._live if gen.detok_instance}
            gone = await self.tokenizers.gone(open_on)
            for gen in list(self._live):
                if gen.detok_instance in gone and not gen.finished:
                    reason = f"tokenizer {gen.detok_instance}, which detokenizes it, is gone"
                    log.warning("request %s: %s", gen.rid, reason)
                    gen.lost(ServiceError("tokenizer_lost", reason, 503))

    async def drain(self) -> None:
        """Wait until every cleanup message scheduled so far is published."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _dispatch(self, batch: GatewayBatch) -> None:
        now, queues, note = time.monotonic(), self._queues, self.arrivals.note
        for item in batch.items:
            queue = queues.get(item.rid)
            if queue is None:
                log.debug("delta for unknown rid %s dropped", item.rid)
            else:
                note(item, now)
                gen = queue.generation
                if gen is None or not gen.offer(item):
                    queue.put_nowait(item)

    def end_open(self) -> int:
        """End every open request with a final 503 (the gateway is stopping); how many."""
        gens = [gen for gen in self._live if not gen.finished]
        for gen in gens:
            gen.lost(ServiceError("shutting_down", "the gateway is stopping; retry the request", 503))
        return len(gens)

    async def _watch_stalls(self) -> None:
        """Resume requests whose output was lost with nothing after it (a lost final delta)."""
        while True:
            await asyncio.sleep(self.config.stall_check_s)
            quiet = self.arrivals.quiet(list(self._live), self.config.stall_s)
            if not quiet or not self.bus.nc.is_connected:
                continue
            short = await short_output(self.bus, self.subjects, quiet, self.config.stall_check_s)
            for gen, why in self.arrivals.confirm(short, self.config.stall_s):
                log.warning("request %s: %s", gen.rid, why)
                gen.lost(errors.stream_gap(f"output of request {gen.rid} lost on the way: {why}"))

    async def submit(self, req: GenerationRequest) -> Generation:
        """Encode, route and submit; returns the running generation.

        Raises ServiceError; nothing is left behind on failure.
        """
        if self._sub is None:
            raise RuntimeError("Pipeline.start() was not called: no output would arrive")
        rid = tracing.request_id.get() or uuid.uuid4().hex  # the HTTP layer's id, if any
        started = request_arrival.get() or time.perf_counter()  # NOTE: from the HTTP arrival
        # the request's span: every bus message of this request carries its trace
        span = _tracer.start_span("gateway.request", attributes={
            "radixmesh.rid": rid, "radixmesh.model": self.model, "radixmesh.tenant": _tenant(req)})
        # NOTE: every submission of a request samples with one seed, so a resumed
        # request continues exactly as it would have on its first worker
        seed = req.params.seed if req.params.seed is not None else secrets.randbits(63)
        try:
            with trace.use_span(span, end_on_exit=False):
                bus_rid, run = await self._launch_fresh(rid, req, Resume(seed=seed))
        except BaseException as exc:
            if self.metrics is not None and isinstance(exc, ServiceError):
                self.metrics.failed(exc.code)
            _end_span(span, "failed", exc)
            raise
        span.set_attributes({"radixmesh.worker": run.worker,
                             "radixmesh.prompt_tokens": len(run.prompt_ids)})
        stream = _tracer.start_span("gateway.stream", context=trace.set_span_in_context(span))
        gen = Generation(rid, run.worker, run.queue, len(run.prompt_ids), span,
                         self.config.request_timeout, self._finish, started=started,
                         stream_span=stream,
                         on_first_token=self.metrics.first_token if self.metrics else None)
        gen.bus_rid, gen.prompt_ids, gen.seed = bus_rid, run.prompt_ids, seed
        gen.predicted_ttft = self.placement.predicted.pop(bus_rid, None)
        gen.detok_instance, gen.session = run.detok_instance, run.session
        gen.enable_retry(req, self._resubmit)
        self._live.add(gen)
        self.submitted += 1
        return gen

    def abort(self, rid: str) -> bool:
        """Stop the open request with public id ``rid`` (and its choices, ``rid/<i>``)
        on its scheduler, as a client disconnect does: its output ends with
        finish_reason ``abort``. False: none open."""
        gens = [gen for gen in self._live if not gen.finished
                and (gen.rid == rid or gen.rid.startswith(rid + "/"))]
        for gen in gens:
            self._publish_later(self.subjects.sched_abort(gen.worker_id), AbortRequest(rid=gen.bus_rid))
        return bool(gens)

    async def _launch_fresh(self, rid: str, req: GenerationRequest,
                            resume: Resume) -> tuple[str, Launched]:
        """Launch under ``rid``; a submit no scheduler answered (one that died
        holding it) is abandoned and launched again under a fresh bus rid."""
        bus_rid, attempt = rid, 1
        deadline = time.monotonic() + self.config.no_worker_wait
        while True:
            try:
                return bus_rid, await self._launch(bus_rid, req, [], resume)
            except ServiceError as exc:
                if exc.code == "service_unavailable" and self._workers_returning(deadline):
                    await asyncio.sleep(0.25)  # NOTE: the same rid: nothing was submitted
                    continue
                if exc.code != "submit_timeout" or attempt == self.config.submit_attempts:
                    raise
                log.warning("request %s: %s; launching again", rid, exc.message)
            bus_rid, attempt = uuid.uuid4().hex, attempt + 1

    def _workers_returning(self, deadline: float) -> bool:
        """No worker is routable now, but one reported lately: worth waiting for (until ``deadline``)."""
        return (time.monotonic() < deadline and self.loads is not None
                and self.loads.heard_within(self.model, WORKER_LIVENESS_S * 4))

    async def _launch(self, rid: str, req: GenerationRequest, exclude: list[str],
                      resume: Resume) -> Launched:
        """Encode, route (avoiding ``exclude``) and submit under ``rid``."""
        queue = DeltaQueue()
        self._queues[rid] = queue
        try:
            enc = await self.bus.request(
                self.subjects.tokenizer_encode(), resume.encode_request(self._encode_request(rid, req)),
                EncodeReply, self.config.bus_timeout,
            )
            try:
                worker, session = await self.placement.place(rid, req, enc, exclude, resume)
            except BaseException:
                self._publish_later(self.subjects.tokenizer_detok(enc.detok_instance),
                                    DetokRelease(rids=[rid]))
                raise
        except BaseException:
            self._queues.pop(rid, None)
            self.placement.predicted.pop(rid, None)
            raise
        return Launched(queue, enc.input_ids, worker, enc.detok_instance, session)

    async def _resubmit(self, gen: Generation, failed_worker: str, exclude: bool = True,
                        code: str = "") -> None:
        """The worker (or, ``exclude`` False, only its scheduler or its tokenizer:
        ``code``) is gone: resume from the output delivered so far; raises 503
        ``no_worker`` if no worker takes it (after up to ``resume_wait`` for a lost
        scheduler's successor, ``tokenizer_wait`` for a tokenizer)."""
        self._forget(gen)
        if exclude:
            gen.failed_workers.append(failed_worker)
        resume = Resume(seed=gen.seed, prompt_ids=gen.prompt_ids, output_ids=list(gen.output_ids),
                         emitted_chars=gen.emitted_chars)
        wait = {"tokenizer_lost": self.config.tokenizer_wait, "stream_gap": self.config.broker_wait,
                "broker_unavailable": self.config.broker_wait}.get(code, self.config.resume_wait)
        # NOTE: a lost host takes workers, tokenizers and schedulers together: even a resume
        # that avoids the lost worker retries while the others' loss is noticed
        began, timeouts = time.monotonic(), 0
        deadline = began + (self.config.resume_wait if exclude else wait)
        while True:
            rid = uuid.uuid4().hex
            try:
                with trace.use_span(gen.span, end_on_exit=False):
                    run = await self._launch(rid, gen.request, list(gen.failed_workers), resume)
                break
            except ServiceError as exc:
                if exc.status not in (503, 504):
                    raise
                # NOTE: 504: a request went to a member of a queue group not yet known lost;
                # a 503 with no worker left to avoid the lost one is final within a second
                # (a replica of the index may be a report behind the others)
                now, timeouts = time.monotonic(), timeouts + (exc.status == 504)
                # NOTE: a first 504 is retried even past the deadline: it cost bus_timeout itself;
                # just after a reconnect the views of workers are being refilled: wait for them
                fresh = now - self.bus.reconnected_at < STALE_AFTER_RECONNECT_S
                if (exc.status == 504 and timeouts == 1) or now < deadline and (
                        exc.status == 504 or not exclude or fresh or now - began < EXCLUDED_RETRY_S):
                    await asyncio.sleep(0.25)
                    continue
                lost = ("its tokenizer was lost" if code == "tokenizer_lost"
                        else f"worker {failed_worker} was lost")
                raise ServiceError("no_worker", f"{lost} and no other "
                                   f"worker could resume request {gen.rid}: {exc.message}",
                                   503) from None
        self.placement.predicted.pop(rid, None)  # NOTE: only a first submission's TTFT is predicted
        log.warning("request %s moved from %s to %s after %d tokens", gen.rid, failed_worker,
                    run.worker, len(gen.output_ids))
        gen.span.add_event("moved", {"radixmesh.from_worker": failed_worker,
                                     "radixmesh.worker": run.worker,
                                     "radixmesh.resumed_tokens": len(gen.output_ids)})
        gen.rebind(rid, run.worker, run.queue, run.detok_instance, run.session)

    def _forget(self, gen: Generation) -> None:
        """Let go of a lost submission: its queue, index booking, detok stream, scheduler."""
        self._queues.pop(gen.bus_rid, None)
        self.arrivals.forget(gen.bus_rid)
        self._publish_later(self.subjects.index_release(),
                            ReleaseRequest(rid=gen.bus_rid, worker_id=gen.worker_id))
        if gen.detok_instance:  # NOTE: a no-op where the error finish already closed it
            self._publish_later(self.subjects.tokenizer_detok(gen.detok_instance),
                                DetokRelease(rids=[gen.bus_rid]))
        self._publish_later(self.subjects.sched_abort(gen.worker_id), AbortRequest(rid=gen.bus_rid))

    def _encode_request(self, rid: str, req: GenerationRequest) -> EncodeRequest:
        return EncodeRequest(
            rid=rid, gateway=self.instance, text=req.text, messages=req.messages,
            input_ids=req.input_ids, add_generation_prompt=req.add_generation_prompt,
            max_new_tokens=req.max_new_tokens, stop=req.params.stop,
            skip_special_tokens=req.params.skip_special_tokens, tools=req.tools,
        )

    def _publish_later(self, subject: str, msg) -> None:
        """Publish from a task of its own, so cancellation of the caller cannot lose it."""
        task = asyncio.get_running_loop().create_task(self._publish(subject, msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish(self, subject: str, msg) -> None:
        try:
            await self.bus.publish(subject, msg)
        except Exception as exc:  # noqa: BLE001 - best effort; the bus may be closing
            log.warning("could not publish %s to %s: %s", type(msg).__name__, subject, exc)

    def _finish(self, gen: Generation) -> None:
        self._live.discard(gen)
        self._queues.pop(gen.bus_rid, None)
        self.arrivals.forget(gen.bus_rid)
        with trace.use_span(gen.span, end_on_exit=False):
            if not gen.finished:
                self._publish_later(self.subjects.sched_abort(gen.worker_id),
                                    AbortRequest(rid=gen.bus_rid))
            self._publish_later(self.subjects.index_release(),
                                ReleaseRequest(rid=gen.bus_rid, worker_id=gen.worker_id))
        usage = gen.final_usage()
        gen.span.set_attributes({
            "radixmesh.prompt_tokens": usage.prompt_tokens,
            "radixmesh.cached_tokens": usage.cached_tokens,
            "radixmesh.completion_tokens": usage.completion_tokens,
        })
        if gen.stream_span is not None:
            gen.stream_span.set_attribute("radixmesh.completion_tokens", usage.completion_tokens)
            _end_span(gen.stream_span, gen.outcome, gen.error)
        _end_span(gen.span, gen.outcome, gen.error)
        if self.metrics is not None:
            self.metrics.finished(gen)


def _tenant(req: GenerationRequest) -> str:
    """The cache namespace as a short digest: traces name the tenant, never its salt."""
    if not req.cache_salt:
        return ""
    return hashlib.blake2b(req.cache_salt.encode(), digest_size=6).hexdigest()


def _end_span(span: Span, outcome: str, exc: BaseException | None) -> None:
    span.set_attribute("radixmesh.outcome", outcome)
    if exc is not None:
        span.record_exception(exc)
        span.set_status(StatusCode.ERROR, str(exc))
    span.end()
