"""The scheduler's cache seam: device KV slots, the radix prefix tree, and tiers.

``available`` = free + reclaimable: slots held only by the tree are taken back
on demand in one place (``make_room``: evict, demoting to the lower tier where
there is one). ``match`` answers how much of a request's prefix is on the device
and how much more sits in lower tiers; ``admit`` locks the device part for the
request (its ``KVHold``). With the cache disabled every request owns all of its
slots and frees them when it ends.
"""

from __future__ import annotations

import numpy as np

from .allocator import OutOfSlots, SlotAllocator
from .radix_cache import RadixCache
from .tree_node import EventSink, LowerTier, MatchResult, TreeNode
from .request import KVHold, Req

NO_MATCH = MatchResult(None, np.empty(0, np.int64), 0, 0)


class KVCache:
    def __init__(self, num_slots: int, enabled: bool = True, page_size: int = 1,
                 policy: str = "lru", on_event: EventSink | None = None,
                 tier: LowerTier | None = None) -> None:
        self.allocator = SlotAllocator(num_slots)
        self.page_size = page_size
        self.tree = RadixCache(page_size, policy, on_event, tier) if enabled else None

    # -- what is free ------------------------------------------------------------

    @property
    def free(self) -> int:
        """Slots free right now."""
        return self.allocator.num_free

    @property
    def reclaimable(self) -> int:
        """Slots held only by the tree: free after eviction (or demotion)."""
        return self.tree.size_info().evictable if self.tree else 0

    @property
    def available(self) -> int:
        return self.free + self.reclaimable

    def alloc(self, n: int) -> np.ndarray:
        self.make_room(n - self.allocator.num_free)
        if n > self.allocator.num_free:
            raise OutOfSlots(f"need {n} KV slots, {self.allocator.num_free} free")
        return self.allocator.alloc(n)

    def make_room(self, n: int) -> None:
        """The one place KV leaves the device: evict (or demote) ``n`` slots' worth."""
        if n > 0 and self.tree:
            self.allocator.free(self.tree.evict(n))

    def keep_lower_free(self, n: int) -> None:
        """Between steps: make the lower tier have ``n`` free slots (dropping its least
        valuable pages), so this step's evictions can demote instead of drop."""
        tier = self.tree.tier if self.tree else None
        if tier is not None and tier.num_free < n:
            self.tree.evict_lower(n - tier.num_free)

    # -- prefixes ------------------------------------------------------------------

    def match(self, req: Req) -> MatchResult:
        """``req``'s cached prefix (device tokens, then lower-tier tokens); changes nothing."""
        if not self.tree:
            return NO_MATCH
        return self.tree.peek(req.namespace, req.fill()[:-1])

    def prefix_len(self, req: Req) -> int:
        """Cached tokens on the device (what admission can start from without copies)."""
        return self.match(req).length

    def reusable_len(self, req: Req) -> int:
        """Cached tokens in any tier: what ``req`` will not compute."""
        match = self.match(req)
        return match.length + match.lower_len

    def admit(self, req: Req) -> MatchResult:
        """Lock ``req``'s cached prefix; it starts from those slots (``req.kv_len``).
        A part in the lower tier is loaded back first (device slots allocated now,
        the copy owed to the next step): loading beats recomputing on every device
        measured so far. Returns the match as found (device and lower lengths)."""
        if not self.tree:
            return NO_MATCH
        self.unpin(req)
        match = self.tree.match_prefix(req.namespace, req.fill()[:-1])
        if match.length:
            self.lock(match.node)
        held = self._load_back(req, match) if match.lower_len else match
        if held.length:
            req.kv = KVHold(slots=[held.slots], tree_len=held.length, node=held.node)
        req.kv_len = held.length
        return match

    def _load_back(self, req: Req, match: MatchResult) -> MatchResult:
        """Bring the lower part of ``match`` (its device part locked) onto the device."""
        # NOTE: the locked device path keeps eviction away from the nodes below it
        slots = self.alloc(match.lower_len)
        self.tree.tier.load(match.lower, slots)
        slots = np.concatenate((match.slots, slots))
        n = len(slots)
        _, node = self.tree.insert(req.namespace, req.fill()[:n], slots)
        self.lock(node)
        if match.length:
            self.unlock(match.node)
        return MatchResult(node, slots, n, 0)

    def pin(self, req: Req, hashes: list[int]) -> None:
        """Keep ``req``'s fetched lower-tier pages until it starts (or ends)."""
        self.unpin(req)
        self.tree.pin(hashes)
        req.pinned = list(hashes)

    def unpin(self, req: Req) -> None:
        if req.pinned and self.tree:
            self.tree.unpin(req.pinned)
        req.pinned = []

    def lock(self, node: TreeNode) -> None:
        self.tree.lock(node)

    def unlock(self, node: TreeNode) -> None:
        self.tree.unlock(node)

    def shorten(self, req: Req, n: int) -> None:
        """Start ``req`` from only the first ``n`` cached tokens (logprobs need logits).
        NOTE: the lock on the deeper node stays (it covers the shorter prefix); the
        request's recomputed copies of [n, matched) become dup_slots when cached."""
        req.kv.slots = [req.kv.all_slots()[:n]] if n else []
        req.kv_len = req.kv.tree_len = n

    def commit(self, req: Req) -> None:
        """Put ``req``'s computed KV into the tree (it keeps running on it)."""
        if not self.tree:
            return
        kv = req.kv
        # NOTE: with steps in flight kv_len may run past the tokens known so far
        n = min(req.kv_len, req.fill_len)
        existing, node = self.tree.insert(req.namespace, req.fill()[:n], kv.all_slots()[:n])
        if existing > kv.tree_len:
            # NOTE: another request cached these tokens meanwhile; ours stay in the
            # worker's table for this request and are freed when it ends.
            kv.dup_slots.append(kv.all_slots()[kv.tree_len : existing].copy())
        kv.tree_len = max(kv.tree_len, n // self.page_size * self.page_size)
        self.lock(node)
        if kv.node is not None:
            self.unlock(kv.node)
        kv.node = node

    def release(self, req: Req) -> None:
        """``req`` ended (or is retracted): cache what it computed, free the rest."""
        if self.tree and req.kv_len:
            self.commit(req)
        kv = req.kv
        # NOTE: every slot past the cached part, those of steps still in flight too
        tail = kv.all_slots()[kv.tree_len :] if self.tree else kv.all_slots()
        for part in [tail, *kv.dup_slots]:
            if len(part):
                self.allocator.free(part)
        if kv.node is not None:
            self.unlock(kv.node)
        req.kv, req.kv_len = KVHold(), 0

    def flush(self) -> int:
        """Empty the cache (refused while requests hold it); returns slots freed."""
        if not self.tree:
            return 0
        slots = self.tree.reset()
        self.allocator.free(slots)
        return len(slots)
