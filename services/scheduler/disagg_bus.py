"""The bus side of prefill/decode disaggregation for one worker's session.

Decode side: send the PrefillRequest of each preallocated request, take KVReady
reports, give up at the deadline (the request then prefills here), cancel the
prefill worker's part and drop staged KV nobody will import. Prefill side: accept
PrefillRequests (refusing a peer of another model or KV layout), send each sampled
request's KV through this worker's data path, report to the decode side.

The core keeps the books (disagg.py); this only moves messages. ``pump`` runs after
every step's flush, after each submit and on a short timer (deadlines).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from opentelemetry import context as otel_context, trace

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import (
    AbortRequest, ErrorInfo, KVDrop, KVReady, KVSend, KVSendReply, PrefillAck, PrefillRequest,
    PrefillStatus, PrefillStatusReply,
)

from .core import SchedulerCore
from .disagg import prefill_sampling
from .disagg_probe import PROBE_TIMEOUT_S, prefill_status, probe
from .driver import StepDriver
from .request import Handoff, Req, Transfer

log = logging.getLogger("scheduler.disagg")
_tracer = trace.get_tracer("radixmesh.scheduler")

WATCH_S = 0.05
DEFAULT_PREFILL_TPS = 500.0  # until the prefill worker measured its own
ACK_TIMEOUT_S = 2.0


class DisaggLink:
    def __init__(self, bus: Bus, subjects: Subjects, driver: StepDriver, session: str) -> None:
        self.bus, self.subjects, self.driver, self.session = bus, subjects, driver, session
        self.core: SchedulerCore = driver.core
        self.worker_id = self.core.info.worker_id
        self._spans: dict[str, trace.Span] = {}
        self._tasks: set[asyncio.Task] = set()

    # -- decode side -------------------------------------------------------------

    def attach(self, req: Req, prefill_worker: str, predicted_s: float) -> None:
        """Mark a submitted request to be prefilled by ``prefill_worker``."""
        req.transfer = Transfer(secrets.token_hex(8), prefill_worker, predicted_s)
        span = _tracer.start_span("scheduler.kv_transfer", attributes={
            "radixmesh.rid": req.rid, "radixmesh.prefill_worker": prefill_worker,
            "radixmesh.decode_worker": self.worker_id,
            "radixmesh.transfer_id": req.transfer.transfer_id})
        self._spans[req.transfer.transfer_id] = span

    async def on_ready(self, msg: KVReady) -> None:
        req = self.core.decode.ready(msg)
        self._end_span(msg.transfer_id, msg)
        if req is not None:
            self.driver.wake()
        self.pump()

    def _request(self, req: Req) -> None:
        t = req.transfer
        t.sent_at = time.monotonic()
        info = self.core.info
        msg = PrefillRequest(
            transfer_id=t.transfer_id, rid=req.rid, input_ids=req.input_ids, sampling=req.sampling,
            seed=req.seed, decode_worker=self.worker_id, decode_host=info.host_id, model=info.model,
            kv_layout=info.kv_layout, skip=t.skip, cache_salt=req.namespace,
            deadline_s=self.core.decode.deadline_s(req))
        span = self._spans.get(t.transfer_id)
        ctx = trace.set_span_in_context(span) if span is not None else None
        self._spawn(self._send_request(req, t.prefill_worker, msg), ctx)

    async def _send_request(self, req: Req, worker: str, msg: PrefillRequest) -> None:
        try:
            ack = await self.bus.request(self.subjects.sched_prefill(worker), msg, PrefillAck, ACK_TIMEOUT_S)
            if req.transfer is not None and req.transfer.transfer_id == msg.transfer_id:
                # NOTE: the deadline grows with the queue the prefill worker reports
                req.transfer.predicted_s = max(req.transfer.predicted_s, ack.predicted_s)
            return
        except ServiceError as exc:
            error = exc
        if req.transfer is None or req.transfer.transfer_id != msg.transfer_id:
            return
        log.warning("prefill worker %s refused %s: %s", worker, req.rid, error.message)
        self._end_span(msg.transfer_id, None, error.code)
        if error.code == "config_mismatch":  # NOTE: a deployment mistake: say so, loudly
            self.core.decode.refuse(req, ErrorInfo(code=error.code, message=error.message, status=409))
        else:
            self.core.decode.fall_back(req, error.code, cancel=error.code == "timeout")
        self.driver.wake()
        self.pump()

    def _expire(self) -> None:
        for req in self.core.decode.expired(time.monotonic()):
            req.transfer.probing = True  # NOTE: now, not when the task starts: one probe each
            self._spawn(self._probe(req))

    async def _probe(self, req: Req) -> None:
        """Past its deadline: renew it if the prefill worker still has it and progresses,
        else prefill here."""
        t = req.transfer
        subject = self.subjects.sched_prefill_status(t.prefill_worker)
        reason = await probe(self.core.decode, req, lambda m: self.bus.request(
            subject, m, PrefillStatusReply, PROBE_TIMEOUT_S))
        if not reason:
            return
        log.warning("transfer for %s from %s %s: prefilling here", req.rid, t.prefill_worker,
                    "stalled (no progress, or waited too long)" if reason == "stalled" else "missed its deadline")
        self._end_span(t.transfer_id, None, reason)
        self.core.decode.fall_back(req, reason)
        self.driver.wake()
        self.pump()

    def _end_span(self, tid: str, msg: KVReady | None, failure: str = "") -> None:
        span = self._spans.pop(tid, None)
        if span is None:
            return
        if msg is not None:
            span.set_attributes({"radixmesh.kv_bytes": msg.nbytes, "radixmesh.kv_tokens": msg.num_tokens,
                                 "radixmesh.kv_path": msg.path, "radixmesh.kv_send_s": msg.seconds,
                                 "radixmesh.cached_tokens": msg.cached_tokens})
            failure = failure or ("" if msg.ok else (msg.error.code if msg.error else "failed"))
        if failure:
            span.set_attribute("radixmesh.kv_failure", failure)
            span.set_status(trace.StatusCode.ERROR, failure)
        span.end()

    # -- prefill side --------------------------------------------------------------

    async def on_prefill(self, msg: PrefillRequest) -> PrefillAck:
        info = self.core.info
        if msg.model != info.model or msg.kv_layout != info.kv_layout:
            raise ServiceError("config_mismatch", (
                f"prefill worker {self.worker_id} serves {info.model!r} with KV {info.kv_layout!r}; "
                f"decode worker {msg.decode_worker} serves {msg.model!r} with KV {msg.kv_layout!r}: "
                "prefill and decode workers must run the same model and KV dtype"), 409)
        if msg.decode_worker == self.worker_id:
            raise ServiceError("invalid_request", "a worker cannot prefill for itself", 400)
        req = Req(rid=msg.transfer_id, input_ids=msg.input_ids, detok_instance="",
                  sampling=prefill_sampling(msg.sampling, msg.seed), namespace=msg.cache_salt)
        req.handoff = Handoff(msg.transfer_id, msg.decode_worker, msg.decode_host,
                              min(max(msg.skip, 0), len(msg.input_ids) - 1), msg.deadline_s)
        position = self.driver.submit(req)
        rate = self.driver.rates.prefill_tps or DEFAULT_PREFILL_TPS
        return PrefillAck(queue_position=position, session=self.session,
                          predicted_s=self.core.queued_prefill_tokens() / rate)

    async def on_prefill_status(self, msg: PrefillStatus) -> PrefillStatusReply:
        rate = self.driver.rates.prefill_tps or DEFAULT_PREFILL_TPS
        return prefill_status(self.core, msg.transfer_id, rate)

    async def _send_kv(self, req: Req) -> None:
        h, book = req.handoff, self.core.prefill
        slots = book.slots(req)
        msg = KVSend(transfer_id=h.transfer_id, slots=slots, dest_worker=h.decode_worker,
                     dest_host=h.decode_host, deadline_s=h.deadline_s)
        try:
            reply = await self.bus.request(self.subjects.worker_kv_send(self.worker_id), msg,
                                           KVSendReply, h.deadline_s + 1.0)
        except ServiceError as exc:
            reply = KVSendReply(ok=False, error=f"{exc.code}: {exc.message}")
        book.end(req)
        self.driver.tracer.ended(req.rid, "handoff" if reply.ok else "error", 1, req.cached_tokens)
        self.driver.wake()
        error = None if reply.ok else ErrorInfo(
            code="transfer_" + reply.error.split(":")[0].strip().replace(" ", "_"),
            message=f"KV transfer {self.worker_id} -> {h.decode_worker} failed: {reply.error}", status=503)
        await self._report(h.decode_worker, KVReady(
            transfer_id=h.transfer_id, ok=reply.ok, first_token=h.first_token, num_tokens=len(slots),
            cached_tokens=req.cached_tokens, nbytes=reply.nbytes, seconds=reply.seconds,
            path=reply.path, prefill_worker=self.worker_id, error=error))

    async def _report(self, decode_worker: str, msg: KVReady) -> None:
        try:
            await self.bus.publish(self.subjects.sched_kv_ready(decode_worker), msg)
        except Exception as exc:  # noqa: BLE001 - the decode side's deadline covers it
            log.info("KV report to %s not sent: %s", decode_worker, exc)

    # -- both ---------------------------------------------------------------------

    def pump(self) -> None:
        """Send what the core's books owe the bus (non-blocking: tasks)."""
        decode, prefill = self.core.decode, self.core.prefill
        for req in decode.take_requests():
            self._request(req)
        for worker, tid in decode.take_cancels():
            self._spawn(self._publish(self.subjects.sched_abort(worker), AbortRequest(rid=tid, reason="abort")))
        drops = decode.take_drops()
        if drops:
            self._spawn(self._publish(self.subjects.worker_kv_drop(self.worker_id), KVDrop(transfer_ids=drops)))
        for req in prefill.take():
            self._spawn(self._send_kv(req))
        for req, error in prefill.take_failed():
            self.driver.tracer.ended(req.rid, "error", 0, req.cached_tokens, error)
            self._spawn(self._report(req.handoff.decode_worker, KVReady(
                transfer_id=req.handoff.transfer_id, ok=False, prefill_worker=self.worker_id, error=error)))

    async def watch(self) -> None:
        """Deadlines of transfers in flight, and anything the books owe."""
        while True:
            await asyncio.sleep(WATCH_S)
            self._expire()
            self.pump()

    async def _publish(self, subject: str, msg) -> None:
        try:
            await self.bus.publish(subject, msg)
        except Exception as exc:  # noqa: BLE001 - best effort: deadlines and TTLs cover a loss
            log.info("%s not sent: %s", subject, exc)

    def _spawn(self, coro, ctx=None) -> None:
        token = otel_context.attach(ctx) if ctx is not None else None
        try:
            task = asyncio.ensure_future(coro)
        finally:
            if token is not None:
                otel_context.detach(token)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for tid in list(self._spans):
            self._end_span(tid, None, "worker_lost")
