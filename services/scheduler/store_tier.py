"""The shared store (L3) at queue time: which of a request's pages to fetch into the
host tier, whether fetching beats recomputing them, and what to do with what arrived.
The books only; the session sends the FetchPages and hands the reply to ``done``.

When a request queues, the pages of its prompt past what the tree holds (device and
host) are fetched if the predicted fetch time (this worker's measured store rate) is
below the predicted recompute time (its prefill rate), with a deadline of
min(recompute, 3 x fetch): at the deadline the worker answers with the leading pages
that arrived intact, they become lower-tier nodes of the tree, and admission loads
them back like any host page; the rest is recomputed. A slow or dead store therefore
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
        self.outcomes: Counter[str] = Counter()
        self.fetched_tokens = 0
        self.fetch_tps = 0.0  # measured: tokens/s the store delivered
        self._slower = 0  # requests not fetched because it was predicted slower

    def plan(self, req: Req, prefill_tps: float) -> Fetch | None:
        """Start fetching ``req``'s uncached pages (host slots reserved), or None."""
        page = self.keys.page_tokens
        match = self.cache.match(req)
        start = match.length + match.lower_len
        pages = ((req.fill_len - 1) // page * page - start) // page
        if start % page or pages < MIN_PAGES:
            return None
        rate = prefill_tps or DEFAULT_PREFILL_TPS
        recompute = pages * page / rate
        fetch = pages * page / (self.fetch_tps or STORE_SPEEDUP * rate)
        if fetch >= recompute:
            self._slower += 1
            if self._slower % PROBE_EVERY:
                self.outcomes["skipped"] += 1
                return None
        pages = min(pages, self._room(pages * page) // page)
        if pages < MIN_PAGES:
            self.outcomes["no_room"] += 1
            return None
        hashes = block_hashes(req.fill()[: start + pages * page], page, req.namespace)[start // page:]
        keys = [page_key(self.keys.model, self.keys.kv_dtype, h) for h in hashes]
        deadline = min(max(min(recompute, 3 * fetch), MIN_DEADLINE_S), MAX_DEADLINE_S)
        planned = Fetch(keys, hashes, self.host.slots.alloc(pages * page), start, deadline)
        self.fetching[req.rid] = (req, planned)
        return planned

    def _room(self, tokens: int) -> int:
        """Free host slots, dropping the least valuable host pages for up to ``tokens``
        (NOTE: between steps only, as ``KVCache.keep_lower_free``)."""
        self.cache.keep_lower_free(min(tokens, self.host.slots.num_slots // 2))
        return self.host.num_free

    def done(self, req: Req, reply: FetchReply) -> int:
        """The worker's answer: the pages that arrived join the tree's lower tier, the
        other host slots are freed. Returns the tokens now in the host tier."""
        _, f = self.fetching.pop(req.rid)
        page = self.keys.page_tokens
        arrived = max(0, min(reply.arrived, len(f.keys)))
        used = 0
        if arrived and not req.aborted and self.cache.tree is not None:
            used = self.cache.tree.insert_lower(req.namespace, req.fill()[: f.start + arrived * page],
                                                f.start, f.slots[: arrived * page])
        if used < len(f.slots):
            self.host.free(f.slots[used:])
        if used:  # NOTE: kept in the host tier until the request starts: room for others is made elsewhere
            self.cache.pin(req, f.hashes[: used // page])
        req.fetched = (f.start, f.start + used)
        self.outcomes[outcome(reply, arrived, len(f.keys))] += 1
        self.fetched_tokens += used
        if arrived and reply.seconds > 0:
            rate = arrived * page / reply.seconds
            self.fetch_tps = rate if not self.fetch_tps else 0.8 * self.fetch_tps + 0.2 * rate
        return used

    def fail_all(self) -> list[Req]:
        """The worker is gone: its fetches' host slots are free again."""
        reqs = [req for req, _ in self.fetching.values()]
        for _, f in self.fetching.values():
            self.host.free(f.slots)
        self.fetching.clear()
        return reqs


def outcome(reply: FetchReply, arrived: int, wanted: int) -> str:
    if reply.error:
        return "error"
    if arrived == wanted:
        return "complete"
    if reply.deadline:
        return "deadline"
    return "partial" if arrived else "miss"
