"""Continuous batching for one worker, with no I/O: queues in, ForwardBatch out.

Each step: running requests decode one token; prefills (new requests, resumed
ones and unfinished chunks) fill the rest of the step's token budget
(``chunked_prefill_size``), so a long prompt runs in chunks next to the
decodes. A request starts from its cached prefix (radix tree) and only
computes the rest. Admission budgets free + evictable slots against the
expected growth of running requests; if decode still runs short, requests are
retracted to the queue and later resume with the same output.

Overlap: ``next_batch`` may be called again before the last step's result
(``complete``) arrives; that step is then planned ahead (see planner.py), and
results are applied in the order the steps were built.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from libs.protocol import ServiceError, errors
from libs.protocol.messages import (
    ErrorInfo, ForwardBatch, ForwardResult, KVEvent, KVEventBatch, KVSnapshot,
    SchedStats, TokenDelta, WorkerInfo,
)

from .allocator import RowAllocator
from .intake import check_request, end_ids
from .kv_cache import KVCache
from .logprobs import pop_logprobs, take_logprobs
from .planner import Plan, plan_step, prefix_cap
from .request import Req


@dataclass(frozen=True)
class BatcherConfig:
    max_running_requests: int = 256
    max_queued_requests: int = 4096
    chunked_prefill_size: int = 1024
    schedule_policy: str = "fcfs"
    enable_cache: bool = True
    page_size: int = 1
    eviction_policy: str = "lru"
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.002
    retract_interval: int = 0  # testing: retract one running request every N steps
    overlap: bool = True  # plan and send step N+1 while the worker runs step N


QUEUE_PEEK = 256  # waiting requests whose cached prefix a load report looks up
EARLY_ABORTS = 4096  # aborts of not (yet) known rids remembered


class Batcher:
    def __init__(self, info: WorkerInfo, config: BatcherConfig) -> None:
        self.info = info
        self.config = config
        self.epoch = secrets.randbits(62)
        self._events: list[KVEvent] = []
        self._event_seq = 0
        self.cache = KVCache(info.kv_slots, config.enable_cache, config.page_size,
                             config.eviction_policy, self._on_event)
        self.rows = RowAllocator(info.max_requests)
        self.eos = frozenset(info.eos_token_ids)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.new_token_ratio = config.init_new_token_ratio
        self._by_rid: dict[str, Req] = {}
        self._early_aborts: OrderedDict[str, bool] = OrderedDict()  # aborts of unknown rids
        self._out: list[tuple[str, TokenDelta]] = []
        self._inflight: deque[Plan] = deque()  # steps built, results not yet applied
        self.last_plan: Plan | None = None
        self.needs_result = False  # the last next_batch waits for the step in flight
        self.steps = 0
        self.counters: Counter[str] = Counter()
        self.batch_sizes: Counter[int] = Counter()

    # -- intake ---------------------------------------------------------------

    def submit(self, req: Req) -> int:
        if self._early_aborts.pop(req.rid, False):
            raise ServiceError("aborted", f"request {req.rid} was aborted before it arrived", 409)
        if req.rid in self._by_rid:
            raise errors.invalid_request(f"request id {req.rid} is already queued")
        if len(self.waiting) >= self.config.max_queued_requests:
            raise errors.overloaded(
                f"server is busy: {len(self.waiting)} requests already queued "
                f"(--max-queued-requests={self.config.max_queued_requests}); retry later"
            )
        check_request(req, self.info)
        if req.sampling.regex:
            req.end_ids = end_ids(req, self.info.eos_token_ids)
        self.waiting.append(req)
        self._by_rid[req.rid] = req
        return len(self.waiting) - 1

    def abort(self, rid: str, reason: str = "abort") -> bool:
        req = self._by_rid.get(rid)
        if req is None:
            # NOTE: a submit the gateway gave up on may still be on its way: remember
            # the abort (bounded) so it is refused instead of computed for no one
            self._early_aborts[rid] = True
            if len(self._early_aborts) > EARLY_ABORTS:
                self._early_aborts.popitem(last=False)
            return False
        req.aborted = True
        if req in self.waiting:
            self.waiting.remove(req)
            self._finish(req, "abort")
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def flush_cache(self) -> int:
        if self.has_work():
            raise errors.invalid_request("cannot flush the cache while requests are running")
        freed = self.cache.flush()
        self.epoch, self._event_seq = secrets.randbits(62), 0
        return freed

    # -- one step ---------------------------------------------------------------

    def next_batch(self) -> ForwardBatch | None:
        """Plan the step (retract, admit, allocate) and build its ForwardBatch;
        with steps in flight it is planned ahead of their results. None: nothing
        to run now (``needs_result``: not before the step in flight is applied)."""
        self._reap_aborted()
        plan = plan_step(self, ahead=bool(self._inflight))
        self.needs_result = plan.sync
        if not plan.items:
            return None
        self.steps += 1
        self.batch_sizes[len(plan.items)] += 1
        batch = plan.to_batch(self.steps)
        self._launch(plan)
        self._inflight.append(plan)
        self.last_plan = plan
        return batch

    def _launch(self, plan: Plan) -> None:
        """The step is sent: its KV positions count as written (later steps run
        after it), its sampled tokens as ``ahead``, its logprobs as reported."""
        for (req, n), (_, count, _) in zip(plan.items, plan.lp_windows):
            take = req.lp_next >= 0 and (count > 0 or req.lp_next == 0)
            plan.lp_zero.append(take and req.lp_next == 0)  # nothing predicts token 0
            plan.lp_first.append(max(req.lp_next, 1) if take else -1)
            if take:
                req.lp_next = plan.lp_first[-1] + count
            req.kv_len += n
            samples = req.kv_len >= req.fill_len + req.ahead
            plan.samples.append(samples)
            req.ahead += samples
        for (req, _), decode in zip(plan.items, plan.decodes):
            if not decode:  # NOTE: shareable now: any step sent later reads it after it is written
                self.cache.cache_prefix(req)

    def complete(self, result: ForwardResult) -> None:
        """Apply the sampled tokens of the oldest step in flight."""
        plan = self._inflight.popleft() if self._inflight else None
        if plan is None or len(result.next_token_ids) != len(plan.items) \
                or len(result.logprobs) != sum(plan.lp_counts):
            raise errors.internal("worker result does not match the step it answers")
        decoded = 0
        lp_at = np.cumsum([0, *plan.lp_counts]).tolist()
        for i, ((req, n), token) in enumerate(zip(plan.items, result.next_token_ids)):
            samples = plan.samples[i]
            req.ahead -= samples
            if req.finish_reason is not None:
                continue  # it ended while this step ran (a stop, an abort): token dropped
            if plan.lp_first[i] >= 0:
                take_logprobs(req, result, token, lp_at[i], plan.lp_counts[i],
                              plan.lp_first[i], plan.lp_zero[i])
            if req.aborted:
                self._finish(req, "abort")
            elif not samples:
                continue  # a prefill chunk (cached when sent)
            elif req.remaining_tokens <= 0:
                self._finish(req, "length")  # max_new_tokens 0: prefill only, now cached
            else:
                decoded += n == 1
                self._append(req, token)
        if decoded:
            self.new_token_ratio = max(self.config.min_new_token_ratio,
                                       self.new_token_ratio - self.config.new_token_ratio_decay)
        self.running = [r for r in self.running if r.finish_reason is None]

    def fail_all(self, error: ErrorInfo) -> None:
        """The worker is gone: every request ends with ``error``."""
        for req in list(self.waiting) + self.running:
            req.error = error
            self._finish(req, "error")
        self.waiting.clear()
        self.running = []
        self._inflight.clear()

    def take_deltas(self) -> list[tuple[str, TokenDelta]]:
        """(detok instance, delta) pairs produced since the last call."""
        out, self._out = self._out, []
        return out

    def take_events(self) -> KVEventBatch | None:
        if not self._events:
            return None
        events, self._events = self._events, []
        batch = KVEventBatch(worker_id=self.info.worker_id, epoch=self.epoch,
                             seq=self._event_seq, page_size=self.config.page_size, events=events,
                             ts=time.time())
        self._event_seq += len(events)
        return batch

    def snapshot(self) -> KVSnapshot:
        """All cached pages; events not yet taken are already reflected in it."""
        hashes = self.cache.tree.all_hashes() if self.cache.tree else []
        return KVSnapshot(worker_id=self.info.worker_id, epoch=self.epoch,
                          seq=self._event_seq + len(self._events),
                          page_size=self.config.page_size, block_hashes=hashes)

    def queued_prefill_tokens(self) -> int:
        """Prompt tokens still to compute: the uncached part of each waiting request
        (NOTE: the first QUEUE_PEEK only are looked up; deeper ones count whole) and
        the rest of each unfinished prefill. The router divides it by the prefill
        rate: counting cached prefixes would make a worker that holds a document
        look busiest exactly when requests for that document queue on it."""
        waiting = sum(r.fill_len - (self.cache.prefix_len(r) if i < QUEUE_PEEK else 0)
                      for i, r in enumerate(self.waiting))
        return waiting + sum(r.fill_len - r.kv_len for r in self.running if not r.decoding)

    def stats(self) -> SchedStats:
        size = self.cache.tree.size_info() if self.cache.tree else (0, 0)
        c = self.counters
        return SchedStats(
            worker_id=self.info.worker_id, steps=self.steps, running=len(self.running),
            waiting=len(self.waiting), free_slots=self.cache.free,
            max_batch_size=max(self.batch_sizes, default=0),
            batch_size_hist=dict(self.batch_sizes), tokens_generated=c["generated"],
            requests_finished=c["finished"], prompt_tokens=c["prompt"], cached_tokens=c["cached"],
            retractions=c["retractions"], cache_enabled=self.cache.tree is not None,
            evictable_slots=size[0], protected_slots=size[1],
        )

    # -- internals -------------------------------------------------------------

    def admit(self, req: Req) -> None:
        """Called by the planner: give ``req`` a row and its cached prefix."""
        self.waiting.remove(req)
        req.row = self.rows.alloc()
        req.new_row = True
        self.cache.admit(req)
        self._cap_prefix(req)
        if not req.retractions:
            req.cached_tokens = req.kv_len
            self.counters["prompt"] += req.prompt_len
            self.counters["cached"] += req.kv_len
        self.running.append(req)

    def _append(self, req: Req, token: int) -> None:
        req.output_ids.append(token)
        self.counters["generated"] += 1
        reason = self._finish_reason(req, token)
        if reason:
            self._finish(req, reason, [token])
            return
        # NOTE: cached_tokens on every delta: a stop string may end the stream before our finish
        self._out.append((req.detok_instance, TokenDelta(rid=req.rid, token_ids=[token],
                                                         cached_tokens=req.cached_tokens,
                                                         logprobs=pop_logprobs(req))))

    def _finish_reason(self, req: Req, token: int) -> str | None:
        if token in req.sampling.stop_token_ids:
            return "stop"
        if not req.sampling.ignore_eos and token in self.eos:
            return "stop"
        if req.remaining_tokens <= 0 or req.fill_len >= self.info.max_model_len:
            return "length"
        return None

    def retract(self, req: Req) -> None:
        """Called by the planner: back to the queue front, KV cached, slots freed."""
        self._release(req)
        self.running.remove(req)
        req.retractions += 1
        self.counters["retractions"] += 1
        self.waiting.appendleft(req)
        self.new_token_ratio = min(1.0, self.new_token_ratio + 0.3)

    def _release(self, req: Req) -> None:
        if req.row >= 0:
            self.cache.release(req)
            self.rows.free(req.row)
            req.row = -1

    def _reap_aborted(self) -> None:
        for req in [r for r in self.running if r.aborted]:
            self._finish(req, "abort")
        self.running = [r for r in self.running if r.finish_reason is None]

    def _finish(self, req: Req, reason: str, tokens: list[int] | None = None) -> None:
        req.finish_reason = reason
        self._release(req)
        self._by_rid.pop(req.rid, None)
        self.counters["finished"] += 1
        self._out.append((req.detok_instance, TokenDelta(
            rid=req.rid, token_ids=tokens or [], finish_reason=reason, error=req.error,
            prompt_tokens=req.prompt_len, completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens, logprobs=pop_logprobs(req),
        )))

    def _cap_prefix(self, req: Req) -> None:
        """Start from a shorter cached prefix when the logprobs need its logits."""
        cap = prefix_cap(req, self.config.page_size)
        if cap is None or req.kv_len <= cap:
            return
        # NOTE: the lock on the deeper node stays (it covers our shorter prefix);
        # our recomputed copies of [cap, matched) become dup_slots when cached.
        req.slots = [req.all_slots()[:cap]] if cap else []
        req.kv_len = req.tree_len = cap

    def _on_event(self, kind: str, namespace: str, hashes: list[int]) -> None:
        self._events.append(KVEvent(kind=kind, namespace=namespace, block_hashes=hashes))

