"""One worker's scheduler core, with no I/O: requests in, ForwardBatches out,
results in, token deltas and KV events out.

The loop around it (driver.py) is::

    batch = core.next_batch()     # plan (planner.py), build (step.py), send
    ...                           # with overlap: the next one, before this result
    core.complete(result)         # the oldest step in flight gets its tokens
    core.take_delta_batches(), core.take_events()

Each step: running requests decode one token; prefills (new requests, resumed
ones and unfinished chunks) fill the rest of the step's token budget, so a long
prompt runs in chunks next to the decodes. A request starts from its cached
prefix (cache.py) and only computes the rest. Results are applied in the order
the steps were sent (``inflight``: the one queue of steps awaiting results).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque

import numpy as np

from libs.protocol import ServiceError, errors
from libs.protocol.messages import (
    ErrorInfo, FetchReply, ForwardBatch, ForwardResult, KVEventBatch, KVSnapshot, LoadReport,
    SchedStats, TokenDelta, WorkerInfo,
)

from . import core_stats
from .allocator import RowAllocator
from .cache import KVCache
from .config import CoreConfig
from .disagg import DecodeBook, PrefillBook
from .reports import EventLog, StepRates
from .host_tier import HostTier, StoreKeys
from .intake import check_request, end_ids
from .logprobs import pop_logprobs, take_logprobs
from .planner import Planner
from .request import Req
from .step import Step
from .store_tier import StoreFetcher

EARLY_ABORTS = 4096  # aborts of not (yet) known rids remembered


class SchedulerCore:
    def __init__(self, info: WorkerInfo, config: CoreConfig) -> None:
        self.info = info
        self.config = config
        self.events = EventLog(info.worker_id, config.page_size)
        # NOTE: the worker's host pool becomes the tree's lower tier (evictions demote to it)
        # NOTE: the shared store (L3) names pages by the tree's page hashes: equal pages only
        keys = (StoreKeys(info.model, info.kv_dtype_name, config.page_size)
                if info.store_page_tokens and info.store_page_tokens == config.page_size else None)
        self.host = (HostTier(info.host_kv_slots, config.host_write_policy, keys)
                     if info.host_kv_slots and config.enable_cache else None)
        self.cache = KVCache(info.kv_slots, config.enable_cache, config.page_size,
                             config.eviction_policy, self.events.record, self.host)
        self.store = StoreFetcher(self.cache, self.host, keys) if self.host and keys else None
        self.rates = StepRates()  # the driver's measurements (it shares its own)
        self.rows = RowAllocator(info.max_requests)
        self.planner = Planner(config, self.cache, self.rows, info.max_model_len, info.role)
        self.eos = frozenset(info.eos_token_ids)
        self.inflight: deque[Step] = deque()  # steps sent, results not yet applied
        self.needs_result = False  # the last next_batch waits for the step in flight
        self.steps = 0
        self.generated = self.finished = 0
        self._pruned_at = 0  # ``finished`` at the last prune of ``running``
        self._aborting: set[Req] = set()  # aborted, not ended yet (``_reap_aborted`` ends those running)
        self.batch_sizes: Counter[int] = Counter()
        self._by_rid: dict[str, Req] = {}
        self._early_aborts: OrderedDict[str, bool] = OrderedDict()
        self._out: dict[str, list[TokenDelta]] = {}  # detok instance -> its deltas, in order
        self.decode = DecodeBook(self)  # prompts a prefill worker computes for us
        self.prefill = PrefillBook(self)  # prompts we compute for decode workers

    @property
    def waiting(self):
        return self.planner.waiting

    @property
    def running(self) -> list[Req]:
        return self.planner.running

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.decode.arrived or self.decode.queue
                    or (self.host is not None and self.host.owes_copies))

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
        self._by_rid[req.rid] = req
        if req.transfer is not None:  # NOTE: its prompt is computed by a prefill worker
            self.decode.submit(req)
            return len(self.decode.queue)
        if self.store is not None and self.store.plan(req, self.rates.prefill_tps) is not None:
            return len(self.waiting)  # NOTE: it queues once its pages arrive (fetched)
        self.waiting.append(req)
        return len(self.waiting) - 1

    def fetched(self, req: Req, reply: FetchReply) -> int:
        """The shared store's pages for ``req`` arrived (or some did): it queues now.
        Returns the tokens that joined the host tier."""
        tokens, riders = self.store.done(req, reply)
        for r in (req, *riders):
            if r.aborted:
                self._finish(r, "abort")
            else:
                self.waiting.append(r)
        return tokens

    def sent(self, rid: str) -> int:
        """Output tokens of ``rid`` put in deltas so far; -1: not held here."""
        req = self._by_rid.get(rid)
        return -1 if req is None else req.sent

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
        self._aborting.add(req)
        if req.transfer is not None:
            self.decode.abort(req)
        elif req in self.waiting:
            self.waiting.remove(req)
            self._finish(req, "abort")
        return True

    def flush_cache(self) -> int:
        if self.has_work():
            raise errors.invalid_request("cannot flush the cache while requests are running")
        freed = self.cache.flush()
        self.events.new_epoch()
        return freed

    # -- one step ---------------------------------------------------------------

    def next_batch(self) -> ForwardBatch | None:
        """Plan the step (retract, admit, allocate), build its ForwardBatch and
        count it as sent; with steps in flight it is planned ahead of their
        results. None: nothing to run now (``needs_result``: not before the step
        in flight is applied)."""
        self._reap_aborted()
        if self.host is not None:  # NOTE: room below for what this step may evict
            self.cache.keep_lower_free(min(self.host.slots.num_slots // 2, self._step_slots()))
        self.decode.preallocate_queued()
        imports = self.decode.activate()  # NOTE: they must ride this very batch
        interval = self.config.retract_interval
        forced = bool(interval and self.steps and self.steps % interval == 0)
        step = self.planner.plan(ahead=bool(self.inflight), force_retract=forced)
        self.needs_result = step.sync
        owed = self.host is not None and self.host.owes_copies  # NOTE: e.g. puts of what the last step computed
        if not step.items and not imports and not owed:
            return None
        self.steps += 1
        self.batch_sizes[len(step.items)] += bool(step.items)
        batch = step.to_batch(self.steps)
        if self.host is not None:
            batch.copies = self.host.take_copies()  # NOTE: they run before this step's forward
            step.copied = sum(len(c.src) for c in batch.copies)
        batch.copies += imports
        step.launch()
        for item in () if step.decode_only else step.items:
            if not item.decode:  # NOTE: shareable now: any step sent later reads it after it is written
                self.cache.commit(item.req)
        self.inflight.append(step)
        return batch

    def _step_slots(self) -> int:
        """The most device slots one step allocates (and so may evict)."""
        return self.config.chunked_prefill_size + self.config.max_running_requests

    @property
    def last_step(self) -> Step:
        return self.inflight[-1]

    def complete(self, result: ForwardResult) -> Step:
        """Apply the sampled tokens of the oldest step in flight; returns that step."""
        step = self.inflight.popleft() if self.inflight else None
        # NOTE: a step whose requests want no logprobs has none to count (most steps)
        counts = [item.lp_count for item in step.items] if step is not None and step.logprobs else []
        if step is None or len(result.next_token_ids) != len(step.items) \
                or len(result.logprobs) != sum(counts):
            raise errors.internal("worker result does not match the step it answers")
        if step.decode_only and not counts:
            self._apply_decodes(step, result.next_token_ids)
            return step
        decoded = False
        lp_at = np.cumsum([0, *counts]).tolist() if counts else []
        append = self._append
        for i, (item, token) in enumerate(zip(step.items, result.next_token_ids)):
            req = item.req
            req.ahead -= item.samples
            if req.finish_reason is not None:
                continue  # it ended while this step ran (a stop, an abort): token dropped
            if item.lp_first >= 0:
                take_logprobs(req, result, token, lp_at[i], item.lp_count, item.lp_first,
                              item.lp_zero)
            if req.aborted:
                self._finish(req, "abort")
            elif not item.samples:
                continue  # a prefill chunk (cached when sent)
            elif req.sampling.max_new_tokens <= len(req.output_ids):
                self._finish(req, "length")  # max_new_tokens 0: prefill only, now cached
            else:
                decoded |= item.tokens == 1
                append(req, token)
        if decoded:
            self.planner.decoded()
        self._prune()
        return step

    def _apply_decodes(self, step: Step, tokens: list[int]) -> None:
        """``complete`` of a decode-only step with no logprobs (most steps): each
        request's one token, in a short pass (what the general loop does for a decode)."""
        append, finish = self._append, self._finish
        for item, token in zip(step.items, tokens):
            req = item.req
            req.ahead -= 1
            if req.finish_reason is not None:
                continue  # it ended while this step ran (a stop, an abort): token dropped
            if req.aborted:
                finish(req, "abort")
            elif req.sampling.max_new_tokens <= len(req.output_ids):
                finish(req, "length")
            else:
                append(req, token)
        if step.items:
            self.planner.decoded()
        self._prune()

    def fail_all(self, error: ErrorInfo) -> None:
        """The worker is gone: every request ends with ``error``."""
        ending = list(self.waiting) + self.running + self.decode.fail_all() + self.prefill.fail_all() \
            + (self.store.fail_all() if self.store else [])
        for req in ending:
            req.error = error
            self._finish(req, "error")
        self.waiting.clear()
        self.running.clear()
        self.inflight.clear()

    # -- what goes out ------------------------------------------------------------

    def take_delta_batches(self) -> dict[str, list[TokenDelta]]:
        """The deltas produced since the last call, per detok instance, in order (a
        DetokBatch each: grouped as they are made, not in a pass over them per step)."""
        out, self._out = self._out, {}
        return out

    def take_deltas(self) -> list[tuple[str, TokenDelta]]:
        """:meth:`take_delta_batches` as (detok instance, delta) pairs."""
        return [(instance, d) for instance, items in self.take_delta_batches().items() for d in items]

    def _emit(self, instance: str, delta: TokenDelta) -> None:
        out = self._out.get(instance)
        if out is None:
            out = self._out[instance] = []
        out.append(delta)

    def take_events(self) -> KVEventBatch | None:
        return self.events.take()

    def snapshot(self) -> KVSnapshot:
        return self.events.snapshot(self.cache.tree)

    def queued_prefill_tokens(self) -> int:
        return self.planner.queued_prefill_tokens()

    def load_report(self, rates: StepRates, scheduler_id: str, ts: float, alive: bool = True,
                    session: str = "") -> LoadReport:
        return core_stats.load_report(self, rates, scheduler_id, ts, alive, session)

    def stats(self) -> SchedStats:
        return core_stats.sched_stats(self)

    # -- internals -------------------------------------------------------------

    def emit_token(self, req: Req, token: int) -> None:
        self._append(req, token)

    def end(self, req: Req, reason: str) -> None:
        self._finish(req, reason)

    def account_prompt(self, req: Req) -> None:
        """A request admitted without the planner (its prompt computed elsewhere)."""
        self.planner.prompt_tokens += req.prompt_len
        self.planner.cached_tokens += req.cached_tokens

    def _append(self, req: Req, token: int) -> None:
        """One sampled token of ``req``: it ends it, or goes out in a delta (or waits
        for the next one, --stream-interval). NOTE: once per request per decode step:
        the common case reads a few attributes and builds one TokenDelta, nothing more."""
        if req.handoff is not None:  # NOTE: the decode worker emits it, not us
            self.prefill.sampled_first(req, token)
            return
        out = req.output_ids
        out.append(token)
        self.generated += 1
        ends = req.ends or self._ends(req)
        n = len(out)
        if n >= ends[1] or token in ends[0]:
            self._finish(req, "length" if token not in ends[0] else "stop")
            return
        sent = req.sent
        if req.streamed and n - sent < self.config.stream_interval:
            return  # NOTE: --stream-interval: held for the next delta
        req.streamed = True
        req.sent = n
        lp = req.lp_pending
        if lp is not None:
            req.lp_pending = None
        # NOTE: cached_tokens on every delta: a stop string may end the stream before our finish
        self._emit(req.detok_instance, TokenDelta(
            rid=req.rid, pos=sent, token_ids=[token] if n - sent == 1 else out[sent:],
            cached_tokens=req.cached_tokens, cached_host_tokens=req.cached_host_tokens,
            cached_store_tokens=req.cached_store_tokens, logprobs=lp))

    @staticmethod
    def _unsent(req: Req) -> list[int]:
        ids = req.output_ids[req.sent:]
        req.sent = len(req.output_ids)
        return ids

    def _ends(self, req: Req) -> tuple[frozenset[int], int]:
        """(the tokens that stop ``req``, the output length that ends it): asked once per
        request, kept on it (its prompt and sampling do not change)."""
        s = req.sampling
        stops = frozenset(s.stop_token_ids or ()) | (frozenset() if s.ignore_eos else self.eos)
        req.ends = (stops, min(s.max_new_tokens, self.info.max_model_len - len(req.input_ids)))
        return req.ends

    def _reap_aborted(self) -> None:
        if not self._aborting:
            return self._prune()  # NOTE: no scan of the batch while nothing was aborted
        for req in [r for r in self.running if r.aborted]:
            self._finish(req, "abort")
        self._prune()

    def _prune(self) -> None:
        if self.finished == self._pruned_at:
            return  # NOTE: every end counts in ``finished``: none since the last prune
        self._pruned_at = self.finished
        self.running[:] = [r for r in self.running if r.finish_reason is None]

    def _finish(self, req: Req, reason: str) -> None:
        req.finish_reason = reason
        self._aborting.discard(req)
        self.planner.drop(req)
        self._by_rid.pop(req.rid, None)
        self.finished += 1
        if req.handoff is not None:
            if reason != "handoff":  # NOTE: ended before its KV went out: tell the decode side
                self.prefill.failed.append((req, req.error or ErrorInfo(
                    code=f"prefill_{reason}", message=f"the prefill ended: {reason}", status=503)))
            return
        self._emit(req.detok_instance, TokenDelta(
            rid=req.rid, pos=req.sent, token_ids=self._unsent(req), finish_reason=reason, error=req.error,
            prompt_tokens=req.prompt_len, completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens, logprobs=pop_logprobs(req),
            cached_host_tokens=req.cached_host_tokens, cached_store_tokens=req.cached_store_tokens,
        ))
