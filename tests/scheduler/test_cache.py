"""The cache seam: device vs lower-tier matches, eviction that demotes, admission's view."""

from __future__ import annotations

import numpy as np

from libs.protocol.hashing import block_hashes
from libs.protocol.messages import SamplingParams
from services.scheduler.allocator import SlotAllocator
from services.scheduler.cache import KVCache
from services.scheduler.radix_cache import RadixCache
from services.scheduler.request import Req


class HostSlots:
    """A lower tier's bookkeeping: a real slot allocator standing for host memory."""

    def __init__(self, n: int) -> None:
        self.slots = SlotAllocator(n)
        self.copies: list[tuple[list[int], list[int]]] = []  # (device, host) copies asked

    def copy_down(self, device_slots: np.ndarray, hashes=()) -> np.ndarray | None:
        if len(device_slots) > self.slots.num_free:
            return None
        host = self.slots.alloc(len(device_slots))
        self.copies.append((device_slots.tolist(), host.tolist()))
        return host

    def backs_up(self, hits: int) -> bool:
        return False

    @property
    def num_free(self) -> int:
        return self.slots.num_free

    exclusive = False

    def free(self, slots: np.ndarray) -> None:
        self.slots.free(slots)


def req(tokens: list[int], ns: str = "") -> Req:
    return Req(rid="r", input_ids=tokens, sampling=SamplingParams(max_new_tokens=4),
               detok_instance="t", namespace=ns)


def cached_tree(tier=None) -> RadixCache:
    tree = RadixCache(page_size=2, tier=tier)
    tree.insert("", [1, 2, 3, 4], np.array([10, 11, 12, 13]))
    tree.insert("", [1, 2, 3, 4, 5, 6], np.array([10, 11, 12, 13, 14, 15]))
    return tree


def test_without_a_tier_eviction_drops_and_nothing_is_lower():
    tree = cached_tree()
    assert sorted(tree.evict(2).tolist()) == [14, 15]
    m = tree.peek("", [1, 2, 3, 4, 5, 6, 7])
    assert (m.length, m.lower_len) == (4, 0)
    tree.check_integrity()


def test_eviction_demotes_and_the_match_counts_the_lower_part():
    tier = HostSlots(8)
    tree = cached_tree(tier)
    freed = tree.evict(2)
    assert sorted(freed.tolist()) == [14, 15] and tier.copies == [([14, 15], [0, 1])]
    m = tree.match_prefix("", [1, 2, 3, 4, 5, 6, 7])
    assert (m.length, m.lower_len, m.slots.tolist()) == (4, 2, [10, 11, 12, 13])
    assert tree.size_info() == (4, 0)  # only device tokens count as evictable
    tree.evict(100)  # the rest goes down too; nothing stays on the device
    m = tree.peek("", [1, 2, 3, 4, 5, 6])
    assert (m.length, m.lower_len) == (0, 6) and tier.slots.num_free == 2
    tree.check_integrity()


def test_a_full_tier_refuses_and_the_node_is_dropped_with_what_lies_below():
    tier = HostSlots(2)
    tree = cached_tree(tier)
    tree.evict(2)  # [5, 6] demoted: the tier is now full
    tree.evict(4)  # [1..4] cannot go down: dropped, and [5, 6] below it with it
    assert tree.peek("", [1, 2, 3, 4, 5, 6]).lower_len == 0
    assert tier.slots.num_free == 2 and tree.size_info().total == 0
    tree.check_integrity()


def test_recomputed_pages_go_back_on_the_device_in_place():
    tier = HostSlots(8)
    tree = cached_tree(tier)
    tree.evict(2)
    existing, node = tree.insert("", [1, 2, 3, 4, 5, 6], np.array([10, 11, 12, 13, 20, 21]))
    assert existing == 4 and node.on_device and node.value.tolist() == [20, 21]
    assert tree.match_prefix("", [1, 2, 3, 4, 5, 6, 0]).length == 6
    tree.evict(2)  # its host copy is still valid: no second copy
    assert len(tier.copies) == 1
    tree.check_integrity()


def test_admission_sees_free_now_and_reclaimable_apart():
    cache = KVCache(16, page_size=2, tier=HostSlots(16))
    r = req([1, 2, 3, 4, 5])
    cache.admit(r)
    r.kv.slots.append(cache.alloc(5))
    r.kv_len = 5
    cache.release(r)  # four tokens cached (page aligned), one freed
    assert (cache.free, cache.reclaimable, cache.available) == (12, 4, 16)
    cache.alloc(14)  # two more than are free: room made by demoting the (one) node
    again = cache.match(req([1, 2, 3, 4, 9]))
    assert (again.length, again.lower_len) == (0, 4)
    assert (cache.free, cache.reclaimable) == (2, 0)
    cache.tree.check_integrity()


def test_events_name_the_medium_and_a_page_is_stored_below_before_it_leaves():
    events = []
    tier = HostSlots(8)
    tree = RadixCache(page_size=2, tier=tier, on_event=lambda *e: events.append(e))
    tree.insert("", [1, 2, 3, 4], np.array([10, 11, 12, 13]))
    (stored,) = events
    assert stored[:2] == ("stored", "") and len(stored) == 3  # device events: no medium
    pages = stored[2]
    tree.evict(4)
    assert events[1:] == [("stored", "", pages, "host"), ("removed", "", pages)]
    assert tree.all_hashes() == [] and tree.host_hashes() == pages
    tree.insert("", [1, 2, 3, 4, 5], np.array([20, 21, 22, 23, 24]))  # recomputed: back on device
    assert events[3] == ("stored", "", pages) and tree.all_hashes() == pages
    big = RadixCache(page_size=2, tier=HostSlots(2), on_event=lambda *e: events.append(e))
    big.insert("", [7, 7, 8, 8], np.array([1, 2, 3, 4]))
    events.clear()
    big.evict(4)  # the tier is too small: dropped, and the index hears it left the device
    assert [e[0] for e in events] == ["removed"] and len(events[0]) == 3


def test_a_full_lower_tier_makes_room_by_dropping_its_least_recent_pages():
    tier = HostSlots(4)
    tree = RadixCache(page_size=2, tier=tier)
    tree.insert("", [1, 2, 3, 4], np.array([10, 11, 12, 13]))
    tree.evict(4)  # A goes down: the tier is full
    tree.insert("", [5, 6, 7, 8], np.array([20, 21, 22, 23]))
    assert tree.evict_lower(4) == 4  # between steps: A leaves host memory ...
    tree.evict(4)  # ... so B is demoted, not dropped
    assert tree.peek("", [5, 6, 7, 8, 0]).lower_len == 4
    assert tree.peek("", [1, 2, 3, 4, 0]).lower_len == 0
    assert tree.evict_lower(100) == 4 and tier.num_free == 4 and tree.size_info().total == 0
    tree.check_integrity()


def test_pinned_lower_pages_stay_until_unpinned():
    tier = HostSlots(8)
    cache = KVCache(8, page_size=2, tier=tier)
    tree = cache.tree
    for tokens, slots in (([1, 2, 3, 4], [10, 11, 12, 13]), ([5, 6, 7, 8], [20, 21, 22, 23])):
        tree.insert("", tokens, np.array(slots))
    tree.evict(8)  # both go down, A first
    waiting = req([1, 2, 3, 4, 0])
    cache.pin(waiting, block_hashes([1, 2, 3, 4], 2, ""))  # A's pages: a queued request fetched them
    assert tree.evict_lower(8) == 4  # only B goes
    assert tree.peek("", [1, 2, 3, 4, 0]).lower_len == 4
    other = req([1, 2, 9])
    cache.pin(other, block_hashes([1, 2], 2, ""))  # another request fetched A's first page
    cache.unpin(waiting)  # it started (or ended)
    assert waiting.pinned == [] and tree.evict_lower(8) == 0  # A is one node: it stays whole
    cache.unpin(other)
    assert not tree.pinned and tree.evict_lower(8) == 4
    tree.check_integrity()
