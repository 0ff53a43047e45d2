"""The shared store (L3) at queue time: which of a request's pages to fetch into the
host tier, whether fetching beats recomputing them, and what to do with what arrived.
The books only; the session sends the FetchPages and hands the reply to ``done``.

When a request queues, the pages of its prompt past what the tree holds (device and
host) are fetched if the predicted fetch time (this worker's measured store rate) is
below the predicted recompute time (its prefill rate), with a deadline of
min(recompute, 3 x fetch): at the deadline the worker answers with the leading pages
that arrived intact, they become lower-tier nodes of the tree, and admission loads
them back like any host page; the rest is recomputed. The worker serves fetches one
at a time, so a fetch is predicted behind those queued before it; a request whose
pages are being fetched for another waits for that fetch instead of a second one. A slow or dead store therefore
costs a request at most the deadline, never a hang.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from libs.protocol.hashing import block_hashes
from libs.protocol.messages import FetchReply
from libs.transfer.store import page_key

from .cache import KVCache
from .host_tier import HostTier, StoreKeys
from .request import Req

MIN_PAGES = 2  # a shorter uncached tail is recomputed: a round trip costs more
PROBE_EVERY = 16  # while fetching is predicted slower, still try one request in this many
DEFAULT_PREFILL_TPS = 500.0
STORE_SPEEDUP = 10.0  # until measured: a fetch counts as this much faster than recomputing
MIN_DEADLINE_S, MAX_DEADLINE_S = 0.05, 5.0


@dataclass(eq=False)
class Fetch:
    keys: list[str]
    hashes: list[int]  # the tree's page hashes of those keys
    slots: np.ndarray  # host slots, ``page_tokens`` per key
    start: int  # tokens cached (device + host) before the fetch: the first key's position
    deadline_s: float


class StoreFetcher:
    def __init__(self, cache: KVCache, host: HostTier, keys: StoreKeys) -> None:
        self.cache, self.host, self.keys = cache, host, keys
        self.fetching: dict[str, tuple[Req, Fetch]] = {}
        self.riders: dict[str, list[Req]] = {}  # a fetch's rid -> requests waiting for the same pages
        self.outcomes: Counter[str] = Counter()
        self.fetched_tokens = 0
        self.fetch_tps = 0.0  # measured: tokens/s the store delivered
        self._slower = 0  # requests not fetched because it was predicted slower

    @property
    def num_waiting(self) -> int:
        return len(self.fetching) + sum(len(r) for r in self.riders.values())

    def plan(self, req: Req, prefill_tps: float) -> Fetch | None:
        """Start fetching ``req``'s uncached pages (host slots reserved), or let it wait for
        a fetch in flight of (nearly) the same pages; None: they are recomputed."""
        page = self.keys.page_tokens
        match = self.cache.match(req)
        start = match.length + match.lower_len
        pages = ((req.fill_len - 1) // page * page - start) // page
        if start % page or pages < MIN_PAGES:
            return None
        hashes = block_hashes(req.fill()[: start + pages * page], page, req.namespace)[start // page:]
        if (ride := self._ride(req, start, hashes)) is not None:
            return ride
        rate = prefill_tps or DEFAULT_PREFILL_TPS
        recompute = pages * page / rate
        # NOTE: the worker fetches one request at a time, in order: this one waits for those before it
        queued = sum(len(f.keys) for _, f in self.fetching.values()) * page
        fetch = (queued + pages * page) / (self.fetch_tps or STORE_SPEEDUP * rate)
        if fetch >= recompute:
            self._slower += 1
            if self._slower % PROBE_EVERY:
                self.outcomes["skipped"] += 1
                return None
        pages = min(pages, self._room(pages * page) // page)
        if pages < MIN_PAGES:
            self.outcomes["no_room"] += 1
            return None
        keys = [page_key(self.keys.model, self.keys.kv_dtype, h) for h in hashes[:pages]]
        deadline = min(max(min(recompute, 3 * fetch), MIN_DEADLINE_S), MAX_DEADLINE_S)
        planned = Fetch(keys, hashes[:pages], self.host.slots.alloc(pages * page), start, deadline)
        self.fetching[req.rid] = (req, planned)
        return planned

    def _ride(self, req: Req, start: int, hashes: list[int]) -> Fetch | None:
        """A fetch in flight from the same position covering most of ``hashes`` (the same
        document asked again while it is fetched): ``req`` waits for it, no second download."""
        for rid, (_, f) in self.fetching.items():
            if f.start == start and common_prefix(f.hashes, hashes) * 10 >= len(hashes) * 9:
                self.riders.setdefault(rid, []).append(req)
                self.outcomes["joined"] += 1
                return f
        return None

    def _room(self, tokens: int) -> int:
        """Free host slots, dropping the least valuable host pages for up to ``tokens``
        (NOTE: between steps only, as ``KVCache.keep_lower_free``)."""
        self.cache.keep_lower_free(min(tokens, self.host.slots.num_slots // 2))
        return self.host.num_free

    def done(self, req: Req, reply: FetchReply) -> tuple[int, list[Req]]:
        """The worker's answer: the pages that arrived join the tree's lower tier, the
        other host slots are freed. Returns the tokens now in the host tier and the
        requests that waited for the same pages."""
        _, f = self.fetching.pop(req.rid)
        riders = self.riders.pop(req.rid, [])
        live = [r for r in (req, *riders) if not r.aborted]
        page = self.keys.page_tokens
        arrived = max(0, min(reply.arrived, len(f.keys)))
        skip = used = 0
        if arrived and live and self.cache.tree is not None:
            skip, used = self.cache.tree.insert_lower(req.namespace, req.fill()[: f.start + arrived * page],
                                                      f.start, f.slots[: arrived * page])
        unused = np.concatenate((f.slots[:skip], f.slots[skip + used:]))
        if len(unused):
            self.host.free(unused)
        for r in live:
            if skip + used:  # NOTE: kept in the host tier until each of them starts (or ends)
                self.cache.pin(r, f.hashes[: (skip + used) // page])
            r.fetched = (f.start + skip, f.start + skip + used)
        self.outcomes[outcome(reply, arrived, len(f.keys))] += 1
        self.fetched_tokens += used
        if arrived and reply.seconds > 0:
            rate = arrived * page / reply.seconds
            self.fetch_tps = rate if not self.fetch_tps else 0.8 * self.fetch_tps + 0.2 * rate
        return used, riders

    def fail_all(self) -> list[Req]:
        """The worker is gone: its fetches' host slots are free again."""
        reqs = [req for req, _ in self.fetching.values()] + [r for rs in self.riders.values() for r in rs]
        for _, f in self.fetching.values():
            self.host.free(f.slots)
        self.fetching.clear()
        self.riders.clear()
        return reqs


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def outcome(reply: FetchReply, arrived: int, wanted: int) -> str:
    if reply.error:
        return "error"
    if arrived == wanted:
        return "complete"
    if reply.deadline:
        return "deadline"
    return "partial" if arrived else "miss"
