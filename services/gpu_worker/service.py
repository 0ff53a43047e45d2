"""The worker on the bus: announce, adoption + lease, and ForwardBatch execution."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time

import msgspec
import torch
from opentelemetry import trace
from prometheus_client import Histogram

from libs.protocol.bus import Bus
from libs.protocol.messages import (
    AdoptRequest, ForwardBatch, ForwardResult, LeaseRenew, PrepareRegex, WorkerInfo,
)
from libs.protocol.subjects import Subjects, check_token
from libs.transfer import KVLayout, shm

from .adoption import Adoption
from .compute import ComputeThread
from .model_runner import ModelRunner

log = logging.getLogger("gpu_worker")
_tracer = trace.get_tracer("radixmesh.gpu_worker")

MAX_PREPARE = 64  # patterns taken from one PrepareRegex

FORWARD_SECONDS = Histogram(
    "radixmesh:forward_seconds", "Model step time on the worker, by step kind", ["kind"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0),
)


class WorkerService:
    """Serves one :class:`ModelRunner` as worker ``worker_id``.

    Subjects: ``worker_announce`` (WorkerInfo every ``announce_s``),
    ``worker_adopt(id)`` (AdoptRequest -> WorkerInfo, 409 already_adopted),
    ``worker_lease(id)`` (LeaseRenew -> WorkerInfo, 409 not_adopted),
    ``worker_forward(id)`` (ForwardBatch -> ForwardResult; 409 when not adopted,
    400 for an invalid batch). Forwards run one at a time on ``compute``, the thread the
    model loaded on (compute.py: one OpenMP team per process); without one, on a thread of
    their own at the caller's torch thread count.
    """

    def __init__(
        self, runner: ModelRunner, worker_id: str, model_name: str, subjects: Subjects,
        announce_s: float = 1.0, detail: dict[str, str] | None = None, role: str = "both",
        host_id: str | None = None, compute: ComputeThread | None = None,
    ) -> None:
        self.runner = runner
        self.worker_id = check_token(worker_id)
        self.model_name = model_name
        self.subjects = subjects
        self.announce_s = announce_s
        self.adoption = Adoption()
        self.role = role  # prefill/decode disaggregation: "both", "prefill" or "decode"
        self.host_id = host_id if host_id is not None else shm.host_id()  # peers with ours share /dev/shm
        self.kv_layout = KVLayout.of_pool(runner.kv).describe()
        self.detail = detail if detail is not None else {}
        self._bus: Bus | None = None
        self._task: asyncio.Task | None = None
        self.compute = compute if compute is not None else ComputeThread(torch.get_num_threads(), release_caller=False)

    def info(self) -> WorkerInfo:
        r = self.runner
        return WorkerInfo(
            worker_id=self.worker_id, model=self.model_name, kv_slots=r.config.kv_slots,
            max_requests=r.config.max_requests, max_model_len=r.max_model_len, vocab_size=r.vocab_size,
            eos_token_ids=r.eos_token_ids, dtype=r.config.dtype, host_kv_slots=r.kv_copies.host_slots,
            store_page_tokens=r.kv_copies.store_page_tokens,
            adopted_by=self.adoption.owner, epoch=self.adoption.epoch,
            role=self.role, kv_layout=self.kv_layout, host_id=self.host_id, host=socket.gethostname(), kv_dtype=r.config.kv_dtype,
        )

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        s, wid = self.subjects, self.worker_id
        await bus.subscribe(s.worker_adopt(wid), self._on_adopt, AdoptRequest)
        await bus.subscribe(s.worker_lease(wid), self._on_lease, LeaseRenew)
        # NOTE: concurrent, so step N+1 (sent while N runs, the overlap schedule) is decoded
        # and queued on the compute thread while N runs; order holds: handler tasks start in
        # the order messages arrive and each reaches the executor's FIFO before its first await
        await bus.subscribe(s.worker_forward(wid), self._on_forward, ForwardBatch, concurrent=True)
        await bus.subscribe(s.worker_prepare(wid), self._on_prepare, PrepareRegex)
        self._task = asyncio.create_task(self._announce_loop())
        self._update_detail()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            # NOTE: said, not left to the lease's lapse: its requests move now, and the
            # gateways do not count it as lost
            with contextlib.suppress(Exception):
                await self._bus.publish(self.subjects.worker_announce(),
                                        msgspec.structs.replace(self.info(), leaving=True))
        self.compute.shutdown()

    async def _announce_loop(self) -> None:
        while True:
            if self.adoption.expire():
                log.warning("lease lapsed; worker %s free again (epoch %d)", self.worker_id, self.adoption.epoch)
                self._update_detail()
            await self._announce()
            await asyncio.sleep(self.announce_s)

    async def _announce(self) -> None:
        try:
            await self._bus.publish(self.subjects.worker_announce(), self.info())
        except Exception as exc:  # noqa: BLE001 - the next tick tries again
            log.warning("announce failed: %s", exc)

    async def _on_adopt(self, msg: AdoptRequest) -> WorkerInfo:
        before = self.adoption.owner
        self.adoption.adopt(msg.scheduler_id, msg.lease_s)
        if before != msg.scheduler_id:
            log.info("adopted by %s (lease %.1fs, epoch %d)", msg.scheduler_id, msg.lease_s, self.adoption.epoch)
            self._update_detail()
            await self._announce()
        return self.info()

    async def _on_lease(self, msg: LeaseRenew) -> WorkerInfo:
        if not msg.release:
            self.adoption.renew(msg.scheduler_id)
            return self.info()
        self.adoption.release(msg.scheduler_id)
        log.info("released by %s (epoch %d)", msg.scheduler_id, self.adoption.epoch)
        self._update_detail()
        await self._announce()  # NOTE: free now: the next scheduler need not wait for an announce
        return self.info()

    async def _on_prepare(self, msg: PrepareRegex) -> None:
        self.runner.constraints.prepare(msg.patterns[:MAX_PREPARE])

    async def _on_forward(self, msg: ForwardBatch) -> ForwardResult:
        self.adoption.require_owner(msg.owner, msg.epoch)
        if trace.get_current_span().is_recording():  # a step that prefills a traced request
            with _tracer.start_as_current_span("gpu_worker.forward", attributes={
                "radixmesh.step": msg.step, "radixmesh.batch_size": len(msg.rows),
                "radixmesh.tokens": len(msg.input_ids),
            }):
                out, elapsed = await self._run(msg)
        else:
            out, elapsed = await self._run(msg)
        prefill = bool(msg.extend_lens) and max(msg.extend_lens) > 1
        FORWARD_SECONDS.labels("prefill" if prefill else "decode").observe(elapsed)
        return ForwardResult(step=msg.step, next_token_ids=out.next_token_ids, forward_ms=elapsed * 1e3,
                             logprobs=out.logprobs, top_ids=out.top_ids,
                             top_logprobs=out.top_logprobs, top_k=out.top_k,
                             copy_ms=self.runner.kv_copies.last_seconds * 1e3)

    async def _run(self, msg: ForwardBatch):
        """``runner.run(msg)`` on the compute thread, and its seconds there: not the wait
        behind the step before it."""
        return await self.compute.run(self._timed, msg)

    def _timed(self, msg: ForwardBatch):
        start = time.perf_counter()
        out = self.runner.run(msg)
        return out, time.perf_counter() - start

    def _update_detail(self) -> None:
        self.detail.update(
            worker_id=self.worker_id, adopted_by=self.adoption.owner or "", epoch=str(self.adoption.epoch)
        )
