"""KV slot ownership for one worker: the free list plus the radix prefix cache.

The allocator evicts unlocked cache entries when it runs short, so "available"
slots are free + evictable. With the cache disabled every request owns all of
its slots and frees them when it ends.
"""

from __future__ import annotations

import numpy as np

from .allocator import OutOfSlots, SlotAllocator
from .radix_cache import EventSink, RadixCache
from .request import Req

class KVCache:
    def __init__(self, num_slots: int, enabled: bool = True, page_size: int = 1,
                 policy: str = "lru", on_event: EventSink | None = None) -> None:
        self.allocator = SlotAllocator(num_slots)
        self.tree = RadixCache(page_size, policy, on_event) if enabled else None

    @property
    def free(self) -> int:
        return self.allocator.num_free

    @property
    def evictable(self) -> int:
        return self.tree.size_info().evictable if self.tree else 0

    @property
    def available(self) -> int:
        return self.free + self.evictable

    def alloc(self, n: int) -> np.ndarray:
        if n > self.allocator.num_free and self.tree:
            self.allocator.free(self.tree.evict(n - self.allocator.num_free))
        if n > self.allocator.num_free:
            raise OutOfSlots(f"need {n} KV slots, {self.allocator.num_free} free")
        return self.allocator.alloc(n)

    def prefix_len(self, req: Req) -> int:
        """Cached prefix length of ``req``'s fill, without touching the tree."""
        if not self.tree:
            return 0
        return self.tree.peek(req.namespace, req.fill()[:-1])[0]

    def prefix_node(self, req: Req) -> object | None:
        """The deepest tree node ``req``'s fill reaches (for dfs-weight ordering)."""
        return self.tree.peek(req.namespace, req.fill()[:-1])[1] if self.tree else None

    def admit(self, req: Req) -> None:
        """Match and lock ``req``'s cached prefix; it starts from those slots."""
        if not self.tree:
            return
        match = self.tree.match_prefix(req.namespace, req.fill()[:-1])
        if match.length:
            self.tree.lock(match.node)
            req.lock_node = match.node
            req.slots = [match.slots]
        req.kv_len = req.tree_len = match.length

    def cache_prefix(self, req: Req) -> None:
        """Put ``req``'s computed KV into the tree (it keeps running on it)."""
        if not self.tree:
            return
        # NOTE: with steps in flight kv_len may run past the tokens known so far
        n = min(req.kv_len, req.fill_len)
        existing, node = self.tree.insert(req.namespace, req.fill()[:n], req.all_slots()[:n])
        if existing > req.tree_len:
            # NOTE: another request cached these tokens meanwhile; ours stay in the
            # worker's table for this request and are freed when it ends.
            req.dup_slots.append(req.all_slots()[req.tree_len : existing].copy())
        aligned = n // self.tree.page_size * self.tree.page_size
        req.tree_len = max(req.tree_len, aligned)
        self.tree.lock(node)
        if req.lock_node is not None:
            self.tree.unlock(req.lock_node)
        req.lock_node = node

    def release(self, req: Req, cache: bool = True) -> None:
        """``req`` ended (or is retracted): cache what it computed, free the rest."""
        slots = req.all_slots()
        if self.tree and cache and req.kv_len:
            self.cache_prefix(req)
        # NOTE: every slot past the cached part, those of steps still in flight too
        tail = slots[req.tree_len :] if self.tree else slots
        for part in [tail, *req.dup_slots]:
            if len(part):
                self.allocator.free(part)
        if self.tree and req.lock_node is not None:
            self.tree.unlock(req.lock_node)
        req.lock_node, req.slots, req.dup_slots = None, [], []
        req.kv_len = req.tree_len = 0

    def flush(self) -> int:
        """Empty the cache (refused while requests hold it); returns slots freed."""
        if not self.tree:
            return 0
        slots = self.tree.reset()
        self.allocator.free(slots)
        return len(slots)

