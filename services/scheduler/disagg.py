"""Prefill/decode disaggregation inside one worker's core: the books, no I/O.

Decode side (``DecodeBook``): a request whose prompt a prefill worker computes first
gets its table row and the slots of its prompt beyond the cached prefix here
(``preallocate``); the bus side then asks the prefill worker. When the KV is staged on
this worker (``ready``) the next step imports it into those slots, the first token is
emitted and the request decodes like any other. Any failure (``fall_back``) releases
the preallocation and queues the request to prefill here, from the front of the queue.

Prefill side (``PrefillBook``): the request runs as a normal prefill of one token;
when its first token is sampled it leaves the running set still holding its KV
(locked in the tree), the bus side sends the KV and reports, then ``end`` frees it.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from typing import Protocol

import msgspec

from libs.protocol.extras import prefills_locally
from libs.protocol.messages import ErrorInfo, KVCopy, KVReady, SamplingParams, WorkerInfo, staging_id

from .allocator import OutOfSlots, RowAllocator
from .metrics import QUEUE_SECONDS
from .cache import KVCache
from .config import CoreConfig
from .planner import Planner
from .request import Req
from .transfer_rates import TransferRates


class Core(Protocol):
    """What the books use of the scheduler core (core.py)."""

    config: CoreConfig
    info: WorkerInfo
    cache: KVCache
    rows: RowAllocator
    planner: Planner

    @property
    def waiting(self): ...

    @property
    def running(self) -> list[Req]: ...

    def emit_token(self, req: Req, token: int) -> None: ...

    def end(self, req: Req, reason: str) -> None: ...

    def account_prompt(self, req: Req) -> None: ...


def remote_eligible(req: Req) -> bool:
    """Whether a prefill worker may compute ``req``'s prompt (the router is told the
    same: RouteRequest.local_prefill)."""
    return not prefills_locally(req.sampling, req.prompt_len, len(req.output_ids))


class DecodeBook:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.queue: deque[Req] = deque()  # waiting for room to preallocate
        self.pending: dict[str, Req] = {}  # transfer id -> preallocated, KV on its way
        self.arrived: list[tuple[Req, KVReady]] = []  # staged: imported by the next step
        self.to_request: list[Req] = []  # preallocated: the bus side sends PrefillRequests
        self.to_cancel: list[tuple[str, str]] = []  # (prefill worker, transfer id) to abort there
        self.to_drop: list[str] = []  # transfer ids whose staged KV this worker must drop
        self.received = self.nbytes = 0
        self.seconds = 0.0
        self.failures: Counter[str] = Counter()
        self.renewals = 0  # deadlines renewed after the prefill side said it has the request
        self.rates = TransferRates(core.info.kv_layout)

    def __len__(self) -> int:
        return len(self.queue) + len(self.pending) + len(self.arrived)

    def requests(self) -> list[Req]:
        return [*self.queue, *self.pending.values(), *(r for r, _ in self.arrived)]

    def submit(self, req: Req) -> None:
        self.queue.append(req)
        self.preallocate_queued()

    def preallocate_queued(self) -> None:
        """Preallocate queued requests in order while there is room."""
        while self.queue and self._preallocate(self.queue[0]):
            req = self.queue.popleft()
            self.pending[req.transfer.transfer_id] = req
            self.to_request.append(req)

    def _preallocate(self, req: Req) -> bool:
        core, cache = self.core, self.core.cache
        running = core.running
        if not core.rows.num_free or len(running) + len(self.pending) >= core.config.max_running_requests:
            return False
        matched = cache.reusable_len(req)
        ratio = core.planner.new_token_ratio
        reserved = sum(math.ceil(r.remaining_tokens * ratio) for r in running)
        if cache.available - matched - reserved < req.prompt_len - matched + req.sampling.max_new_tokens * ratio:
            return False
        cache.admit(req)
        try:
            req.kv.add(cache.alloc(req.prompt_len - req.kv_len))
        except OutOfSlots:
            cache.release(req)
            return False
        req.row, req.new_row = core.rows.alloc(), True
        req.transfer.skip = req.kv_len
        return True

    def take_requests(self) -> list[Req]:
        out, self.to_request = self.to_request, []
        return [r for r in out if r.transfer is not None and r.transfer.transfer_id in self.pending]

    def take_cancels(self) -> list[tuple[str, str]]:
        out, self.to_cancel = self.to_cancel, []
        return out

    def take_drops(self) -> list[str]:
        out, self.to_drop = self.to_drop, []
        return out

    def tail_slots(self, req: Req) -> list[int]:
        return req.kv.all_slots()[req.transfer.skip : req.prompt_len].tolist()

    def ready(self, msg: KVReady) -> Req | None:
        """A prefill worker's report; the request it concerns, if still pending."""
        if msg.ok:  # NOTE: a late one too: it measured the path all the same
            self.rates.observe(msg.prefill_worker, msg.nbytes, msg.seconds)
        req = self.pending.get(msg.transfer_id)
        if req is None:
            if msg.ok:  # NOTE: nobody will import it (we gave up on it): free it now
                self.to_drop.append(msg.transfer_id)
            return None
        if not msg.ok:
            self.fall_back(req, msg.error.code if msg.error else "prefill_failed", cancel=False)
        elif msg.num_tokens != req.prompt_len - req.transfer.skip or msg.first_token < 0:
            self.fall_back(req, "short_transfer")
        else:
            del self.pending[msg.transfer_id]
            self.arrived.append((req, msg))
        return req

    def activate(self) -> list[KVCopy]:
        """Before a step is planned: each request whose KV arrived starts decoding;
        the returned imports must ride the very batch built next."""
        core, copies = self.core, []
        arrived, self.arrived = self.arrived, []
        for req, msg in arrived:
            tid = req.transfer.transfer_id
            self._count(req, msg)
            if req.aborted:
                self.to_drop.append(tid)
                core.end(req, "abort")
                continue
            req.cached_tokens = msg.cached_tokens
            QUEUE_SECONDS.labels("decode").observe(time.monotonic() - req.arrived)
            core.account_prompt(req)
            core.emit_token(req, msg.first_token)
            if req.finish_reason is not None:  # it ended at its first token: KV not needed
                self.to_drop.append(tid)
                continue
            copies.append(KVCopy(kind="import", dst=self.tail_slots(req), buffer=staging_id(tid)))
            req.kv_len = req.prompt_len  # NOTE: written by the import, before any forward
            core.running.append(req)
        return copies

    def _count(self, req: Req, msg: KVReady) -> None:
        self.received += 1
        self.nbytes += msg.nbytes
        self.seconds += time.monotonic() - req.transfer.sent_at if req.transfer.sent_at else msg.seconds

    def fall_back(self, req: Req, reason: str, cancel: bool = True) -> None:
        """Give up on the prefill worker: free the preallocation, prefill here (queue front)."""
        tid = req.transfer.transfer_id
        if self.pending.pop(tid, None) is None:
            return
        self.failures[reason] += 1
        self.to_drop.append(tid)
        if cancel:
            self.to_cancel.append((req.transfer.prefill_worker, tid))
        self._unhold(req)
        req.transfer = None
        if req.aborted:
            self.core.end(req, "abort")
        else:
            self.core.waiting.appendleft(req)

    def refuse(self, req: Req, error: ErrorInfo) -> None:
        """The prefill worker refused the pair (another model or KV layout): ``req`` fails."""
        tid = req.transfer.transfer_id
        if self.pending.pop(tid, None) is None:
            return
        self.failures[error.code] += 1
        self._unhold(req)
        req.error = error
        self.core.end(req, "error")

    def abort(self, req: Req) -> bool:
        """``req`` aborted while its KV is on the way (or it waits for room)."""
        if req in self.queue:
            self.queue.remove(req)
            self.core.end(req, "abort")
            return True
        tid = req.transfer.transfer_id
        if tid in self.pending:
            del self.pending[tid]
            self.to_cancel.append((req.transfer.prefill_worker, tid))
            self.to_drop.append(tid)
            self._unhold(req)
            self.core.end(req, "abort")
            return True
        return False  # arrived: activate() ends it

    def expired(self, now: float) -> list[Req]:
        """Pending past their deadline (from the request or its last renewal, capped by
        the total wait bound), not probed now."""
        return [r for r in self.pending.values() if r.transfer.sent_at and not r.transfer.probing
                and now > r.transfer.due(self.deadline_s(r))]

    def renew(self, req: Req, predicted_s: float, now: float) -> None:
        """The prefill side still has ``req``: its deadline runs again from ``now``."""
        req.transfer.predicted_s, req.transfer.renewed_at = predicted_s, now
        self.renewals += 1

    def deadline_s(self, req: Req) -> float:
        """Seconds this side waits for ``req``'s transfer: three times the prediction
        (the larger of the router's and the prefill side's prefill seconds, at least
        2 ms per prompt token, plus moving the tokens beyond ``skip`` at this worker's
        measured transfer rate from that peer), plus a second."""
        t = req.transfer
        moved = self.rates.seconds(t.prefill_worker, req.prompt_len - t.skip)
        return 3 * (max(t.predicted_s, req.prompt_len * 2e-3) + moved) + 1.0

    def fail_all(self) -> list[Req]:
        reqs = self.requests()
        for req in [*self.pending.values(), *(r for r, _ in self.arrived)]:
            self._unhold(req)
        self.queue.clear()
        self.pending.clear()
        self.arrived.clear()
        return reqs

    def _unhold(self, req: Req) -> None:
        """Free a preallocation: the prompt's tail was never written (kv_len = skip)."""
        core = self.core
        core.cache.release(req)
        if req.row >= 0:
            core.rows.free(req.row)
            req.row = -1


class PrefillBook:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.sampled: list[Req] = []  # first token sampled: the bus side sends their KV
        self.sending: set[Req] = set()
        self.failed: list[tuple[Req, ErrorInfo]] = []  # ended before their KV went out
        self.sent = 0

    def sampled_first(self, req: Req, token: int) -> None:
        req.handoff.first_token = token
        self.core.running.remove(req)
        self.sampled.append(req)

    def take(self) -> list[Req]:
        out, self.sampled = self.sampled, []
        self.sending.update(out)
        return out

    def slots(self, req: Req) -> list[int]:
        return req.kv.all_slots()[req.handoff.skip : req.prompt_len].tolist()

    def end(self, req: Req) -> None:
        """The KV went out (or could not): free it (the prompt stays cached here)."""
        self.sending.discard(req)
        if req.finish_reason is None:  # NOTE: fail_all may have ended it meanwhile
            self.sent += 1
            self.core.end(req, "handoff")

    def take_failed(self) -> list[tuple[Req, ErrorInfo]]:
        out, self.failed = self.failed, []
        return out

    def fail_all(self) -> list[Req]:
        reqs = [*self.sampled, *self.sending]
        self.sampled.clear()
        self.sending.clear()
        return reqs


def prefill_sampling(sampling: SamplingParams, seed: int) -> SamplingParams:
    """The decode request's sampling, to sample its first token only (the same token
    the decode worker would sample: sampling is a function of seed and position)."""
    return msgspec.structs.replace(sampling, max_new_tokens=1, seed=seed)
