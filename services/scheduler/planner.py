"""Plan one step: make room for decodes, continue chunked prefills, admit new work.

Token budget per step = ``chunked_prefill_size`` prefill tokens (decodes are
extra). A request is admitted only if available KV (free + reclaimable) covers
its uncached prompt plus its expected output (remaining x new_token_ratio) on
top of the expected growth of everything already running; when a decode step
still finds no room, the request with the least progress is retracted (back to
the queue front, its KV cached) and later resumes with the same output.

Planned ahead (a step still in flight, the overlap schedule), a decode reads
the token the step in flight samples (-1 on the wire); requests whose tokens in
flight end them are left out, and a step that would have to retract is not
planned ahead at all (``Step.sync``): it waits for the result.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Iterator

from .allocator import RowAllocator
from .cache import KVCache
from .config import CoreConfig
from .metrics import QUEUE_SECONDS
from .policy import order
from .request import Req
from .step import Step, StepItem, prefix_cap

SHARE_PROBE = 32  # tokens past the cached prefix that mark two prompts as sharing
QUEUE_PEEK = 256  # waiting requests whose cached prefix a load report looks up


class Planner:
    """Owns the waiting queue and the running set; turns them into steps."""

    def __init__(self, config: CoreConfig, cache: KVCache, rows: RowAllocator,
                 max_model_len: int, role: str = "both") -> None:
        self.config = config
        self.role = role  # the worker's: labels the queue-time metric
        self.cache = cache
        self.rows = rows
        self.max_model_len = max_model_len
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.new_token_ratio = config.init_new_token_ratio
        self.retractions = self.prompt_tokens = self.cached_tokens = 0

    def plan(self, ahead: bool, force_retract: bool) -> Step:
        """The next step; ``ahead``: a step is still in flight."""
        step = Step()
        decode = [r for r in self.running if r.decodes_next(self.max_model_len)]
        if ahead and (force_retract or (decode and self.cache.available < len(decode))):
            step.sync = True
            return step
        if force_retract and len(decode) > 1:
            self._retract(step, victims(decode)[0])
            decode = [r for r in self.running if r.decoding]
        while decode and self.cache.available < len(decode) and len(self.running) > 1:
            victim = victims(self.running)[0]
            self._retract(step, victim)
            if victim in decode:
                decode.remove(victim)
        step.items = [StepItem(r, 1, True) for r in decode]
        used, budget = len(decode), self.config.chunked_prefill_size
        prefilling = [] if len(decode) == len(self.running) else [r for r in self.running if not r.decoding]
        for req in prefilling:  # unfinished prefills first
            n = min(budget, req.fill_len - req.kv_len, self.cache.available - used)
            if n > 0:
                step.items.append(StepItem(req, n))
                used, budget = used + n, budget - n
        if not step.retracted:
            used = self._admit(step, used, budget)
        step.decode_only = used == len(decode)  # NOTE: no prefill item (each has tokens > 0)
        if step.items:
            self._allocate(step, used)
        return step

    def drop(self, req: Req) -> None:
        """``req`` ended: cache what it computed, free its slots and row."""
        self.cache.unpin(req)
        if req.row >= 0:
            self.cache.release(req)
            self.rows.free(req.row)
            req.row = -1

    def decoded(self) -> None:
        """A step decoded tokens: expect a little less output from everyone."""
        cfg = self.config
        self.new_token_ratio = max(cfg.min_new_token_ratio,
                                   self.new_token_ratio - cfg.new_token_ratio_decay)

    def queued_prefill_tokens(self) -> int:
        """Prompt tokens still to compute: the uncached part of each waiting request
        (NOTE: the first QUEUE_PEEK only are looked up; deeper ones count whole) and
        the rest of each unfinished prefill. The router divides it by the prefill
        rate: counting cached prefixes would make a worker that holds a document
        look busiest exactly when requests for that document queue on it."""
        return sum(tokens for _, tokens in self.prefill_backlog())

    def prefill_backlog(self) -> Iterator[tuple[Req, int]]:
        """Each request with prompt tokens still to compute and how many, in the order
        they will be: unfinished prefills first, then the queue (counted as
        ``queued_prefill_tokens`` says)."""
        for r in self.running:
            if not r.decoding:
                yield r, r.fill_len - r.kv_len
        for i, r in enumerate(self.waiting):
            yield r, r.fill_len - (self.cache.reusable_len(r) if i < QUEUE_PEEK else 0)

    # -- internals ---------------------------------------------------------------

    def _admit(self, step: Step, used: int, budget: int) -> int:
        if not self.waiting:
            return used  # NOTE: a decode-only step: nothing below to do for each running request
        cfg, cache = self.config, self.cache
        ratio = self.new_token_ratio
        reserved = sum(math.ceil(r.remaining_tokens * ratio) for r in self.running)
        for req in order(cfg.schedule_policy, self.waiting, cache):
            if budget <= 0 or self.rows.num_free == 0 or len(self.running) >= cfg.max_running_requests:
                break
            matched = cache.prefix_len(req)
            cap = prefix_cap(req, cache.page_size)
            matched = matched if cap is None else min(matched, cap)
            if self._shares_running_prefill(req, matched):
                continue  # wait one step: it will hit the prefix that is being computed
            expected = math.ceil(req.remaining_tokens * ratio)
            # NOTE: locking the matched prefix takes it out of the reclaimable pool.
            if cache.available - matched - used - reserved < req.fill_len - matched + expected:
                break
            self._start(req, cap)
            n = min(budget, req.fill_len - req.kv_len)
            step.items.append(StepItem(req, n))
            used, budget, reserved = used + n, budget - n, reserved + expected
        return used

    def _start(self, req: Req, cap: int | None) -> None:
        """Give ``req`` a row and its cached prefix (shortened to ``cap``)."""
        self.waiting.remove(req)
        req.row, req.new_row = self.rows.alloc(), True
        device = self.cache.admit(req).length
        if cap is not None and req.kv_len > cap:
            self.cache.shorten(req, cap)
        if not req.retractions:
            QUEUE_SECONDS.labels(self.role).observe(time.monotonic() - req.arrived)
            req.cached_tokens = req.kv_len
            lower = max(req.kv_len - device, 0)
            # NOTE: loaded back [device, kv_len); of those, what its store fetch brought
            start, end = req.fetched
            req.cached_store_tokens = max(0, min(end, req.kv_len) - max(start, device))
            req.cached_host_tokens = lower - req.cached_store_tokens
            self.prompt_tokens += req.prompt_len
            self.cached_tokens += req.kv_len
        self.running.append(req)

    def _shares_running_prefill(self, req: Req, matched: int) -> bool:
        if self.cache.tree is None:
            return False
        fill = req.fill()
        end = matched + SHARE_PROBE
        if len(fill) < end:
            return False
        probe = fill[:end]
        return any(
            r.namespace == req.namespace and r.kv_len < end and r.fill_len >= end
            and r.fill()[:end] == probe
            for r in self.running if not r.decoding
        )

    def _retract(self, step: Step, req: Req) -> None:
        """Back to the queue front, KV cached, slots freed."""
        self.drop(req)
        self.running.remove(req)
        req.retractions += 1
        self.retractions += 1
        self.waiting.appendleft(req)
        self.new_token_ratio = min(1.0, self.new_token_ratio + 0.3)
        step.retracted.append(req)

    def _allocate(self, step: Step, total: int) -> None:
        step.slots = self.cache.alloc(total)
        if step.decode_only:  # NOTE: one slot each, the same order: the step hands them out as it is built
            step.slot_ids = step.slots.tolist()
            return
        start = 0
        for item in step.items:
            item.req.kv.add(step.slots[start : start + item.tokens])
            start += item.tokens


def victims(reqs: list[Req]) -> list[Req]:
    """Cheapest to redo first: fewest outputs, then longest prompt."""
    return sorted(reqs, key=lambda r: (len(r.output_ids), -r.prompt_len))
