"""The bus side of one worker's core: send each step, await its result, publish.

The core (core.py) plans; this file only moves messages. With overlap the next
step is planned and sent while the worker runs the current one (its decodes
read the tokens that one samples on the worker), so the worker never waits for
the scheduler between steps. The steps awaiting results are the core's
``inflight`` queue; each carries its reply future in ``Step.pending``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from opentelemetry import context as otel_context

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import DetokBatch, ErrorInfo, ForwardResult

from .core import SchedulerCore
from .reports import StepRates
from .request import Req
from .tracing import StepTracer

log = logging.getLogger("scheduler.driver")


LOST_REPLY_S = 1.0


class WorkerLost(Exception):
    pass


class StepDriver:
    """Drives one worker until stopped or until the worker fails a step."""

    def __init__(self, bus: Bus, subjects: Subjects, core: SchedulerCore,
                 forward_timeout: float = 300.0) -> None:
        self.bus = bus
        self.subjects = subjects
        self.core = core
        self.worker_id = core.info.worker_id
        self.forward_timeout = forward_timeout
        self.fence: tuple[str, int] = ("", -1)  # (owner, epoch) stamped on every step
        self.tracer = StepTracer(self.worker_id)
        self._wake = asyncio.Event()
        self._stopped = False
        self.overlap = core.config.overlap
        self._reconnects_at: dict[int, int] = {}  # step number -> bus reconnects when sent
        # worker idle fraction: forward time vs wall time while work was in flight
        self._active_since: float | None = None
        self.active_s = 0.0
        self.busy_s = 0.0
        self.rates = core.rates  # NOTE: shared: the core plans store fetches with them
        self.on_flush = None  # called after each flush (the prefill/decode link pumps)

    @property
    def idle_fraction(self) -> float:
        """Share of the time the worker waited for its next step while work was queued."""
        return max(0.0, 1.0 - self.busy_s / self.active_s) if self.active_s else 0.0

    def submit(self, req: Req) -> int:
        position = self.core.submit(req)
        self.tracer.submitted(req)
        self._wake.set()
        return position

    def abort(self, rid: str, reason: str) -> None:
        if self.core.abort(rid, reason):
            self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    async def run(self) -> None:
        """Step until stopped; raises WorkerLost after failing every request."""
        forward = self.subjects.worker_forward(self.worker_id)
        # NOTE: steps belong to no trace unless one prefills a traced request
        otel_context.attach(otel_context.Context())
        inflight = self.core.inflight
        while not self._stopped:
            if not inflight:
                if not self.core.has_work():
                    await self.flush()
                    self._active_since = None
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if not self._send(forward):
                    await self.flush()
                    await asyncio.sleep(0.005)
                    continue
            if self.overlap and len(inflight) == 1:
                self._send(forward)  # planned ahead of the step in flight
            # NOTE: the last applied step's deltas and KV events go out while the worker runs.
            await self.flush()
            oldest = inflight[0]
            try:
                result = await self._reply(oldest.pending, self._reconnects_at.pop(oldest.number))
            except ServiceError as exc:
                await self._lost(oldest.number, exc)
            self._account(result.forward_ms / 1e3)
            seconds = (result.forward_ms - result.copy_ms) / 1e3
            if oldest.decode_only and oldest.items:  # NOTE: no list of ones per step
                self.rates.measure_decodes(len(oldest.items), seconds)
            elif oldest.items:  # NOTE: not a copy-only step
                self.rates.measure([item.tokens for item in oldest.items], seconds)
            self.rates.copied(oldest.copied, result.copy_ms / 1e3)
            self.tracer.step_done(self.core.complete(result))

    async def _lost(self, number: int, exc: ServiceError) -> None:
        for later in self.core.inflight:
            later.pending.cancel()
        log.error("worker %s failed step %d: %s", self.worker_id, number, exc)
        # NOTE: refused as no longer its owner: the worker is fine, another scheduler drives it
        code = "scheduler_lost" if exc.code in ("stale_owner", "not_adopted") else "worker_failed"
        self.fail_all(ErrorInfo(code=code, status=503,
                                message=f"worker {self.worker_id} failed: {exc.message}"))
        await self.flush()
        raise WorkerLost(str(exc)) from exc

    def _send(self, forward: str) -> bool:
        """Plan the next step and send it; False if there is nothing to send."""
        batch = self.core.next_batch()
        if batch is None:
            return False
        batch.owner, batch.epoch = self.fence
        step = self.core.last_step
        parent = self.tracer.step_started(step)
        self._account(0.0)
        token = otel_context.attach(parent) if parent is not None else None
        # NOTE: nc.request queues its message before its first await, and tasks
        # start in creation order: steps reach the worker in the order sent
        step.pending = asyncio.ensure_future(
            self.bus.request(forward, batch, ForwardResult, timeout=self.forward_timeout))
        if token is not None:
            otel_context.detach(token)
        self._reconnects_at[step.number] = self._reconnects()
        return True

    def _reconnects(self) -> int:
        return self.bus.nc.stats.get("reconnects", 0)

    async def _reply(self, step: asyncio.Future, reconnects: int) -> ForwardResult:
        """The step's result. NOTE: if the broker connection dropped after the
        step was sent, its request or reply may be gone with the old connection:
        past ``LOST_REPLY_S`` after reconnecting, the step counts as failed."""
        lost_at: float | None = None
        while True:
            done, _ = await asyncio.wait({step}, timeout=LOST_REPLY_S / 2)
            if done:
                return step.result()
            if self._reconnects() == reconnects or not self.bus.nc.is_connected:
                continue
            lost_at = lost_at or time.monotonic() + LOST_REPLY_S
            if time.monotonic() >= lost_at:
                step.cancel()
                raise ServiceError("broker_unavailable",
                                   "the broker connection dropped while the step ran", 503)

    def _account(self, forward_s: float) -> None:
        """Wall time while steps were queued or running, and the worker's share of it."""
        now = time.perf_counter()
        if self._active_since is not None:
            self.active_s += now - self._active_since
        self._active_since = now
        self.busy_s += forward_s

    def fail_all(self, error: ErrorInfo) -> None:
        self.core.fail_all(error)

    async def flush(self) -> None:
        """Publish this step's KV events, then its deltas: one DetokBatch per
        tokenizer instance."""
        events = self.core.take_events()
        if events is not None:
            await self.bus.publish(self.subjects.index_events(self.worker_id), events)
        if self.on_flush is not None:
            self.on_flush()
        deltas = self.core.take_delta_batches()
        if not deltas:
            return
        self.tracer.finished(deltas)
        step = self.core.steps
        for instance, items in deltas.items():
            await self.bus.publish(
                self.subjects.tokenizer_detok(instance),
                DetokBatch(worker_id=self.worker_id, step=step, items=items),
            )
