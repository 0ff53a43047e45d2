"""The radix tree alone: no broker, no model."""

from __future__ import annotations

import copy
import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.protocol.hashing import block_hashes
from services.scheduler.radix_cache import RadixCache


def slots_for(tokens, base):
    return np.arange(base, base + len(tokens), dtype=np.int64)


def test_insert_match_and_split():
    tree = RadixCache()
    a = [1, 2, 3, 4, 5]
    existing, _ = tree.insert("", a, slots_for(a, 100))
    assert existing == 0
    m = tree.match_prefix("", [1, 2, 3, 9])
    assert m.length == 3 and m.slots.tolist() == [100, 101, 102]
    existing, _ = tree.insert("", [1, 2, 3, 7, 8], slots_for(range(5), 200))
    assert existing == 3  # the caller frees its own slots 200..202
    assert tree.match_prefix("", [1, 2, 3, 7, 8, 9]).slots.tolist() == [100, 101, 102, 203, 204]
    assert tree.size_info().total == 7
    tree.check_integrity()


def test_partial_and_empty_matches():
    tree = RadixCache()
    tree.insert("", [5, 6, 7], slots_for(range(3), 0))
    assert tree.match_prefix("", [9, 9]).length == 0
    assert tree.match_prefix("", []).length == 0
    assert tree.match_prefix("", [5, 6, 7, 8]).length == 3


def test_page_alignment():
    tree = RadixCache(page_size=4)
    toks = list(range(10))
    tree.insert("", toks, slots_for(toks, 0))
    assert tree.size_info().total == 8  # the partial third page is not cached
    assert tree.match_prefix("", list(range(7)) + [99]).length == 4
    assert tree.match_prefix("", list(range(8)) + [99]).length == 8
    assert tree.match_prefix("", [0, 1, 2, 99]).length == 0
    tree.check_integrity()


def test_lock_moves_exactly_the_locked_tokens():
    tree = RadixCache()
    tree.insert("", [1, 2, 3, 4], slots_for(range(4), 0))
    tree.insert("", [1, 2, 9], slots_for(range(3), 10))
    m = tree.match_prefix("", [1, 2, 9])
    tree.lock(m.node)
    assert tree.size_info() == (2, 3)  # [3, 4] evictable; [1, 2] + [9] protected
    assert sorted(tree.evict(10).tolist()) == [2, 3]
    assert tree.size_info() == (0, 3)
    tree.unlock(m.node)
    assert tree.size_info() == (3, 0)
    with pytest.raises(RuntimeError):
        tree.unlock(m.node)
    tree.check_integrity()


def test_eviction_is_lru_and_frees_what_it_reports():
    tree = RadixCache()
    tree.insert("", [1, 1], np.array([0, 1]))
    tree.insert("", [2, 2], np.array([2, 3]))
    tree.insert("", [3, 3], np.array([4, 5]))
    tree.match_prefix("", [1, 1])  # touch: [2, 2] is now least recent
    freed = tree.evict(1)
    assert freed.tolist() == [2, 3]
    assert tree.size_info().total == 4
    freed = tree.evict(100)
    assert sorted(freed.tolist()) == [0, 1, 4, 5] and tree.size_info().total == 0


def test_evictions_after_a_scan_follow_later_touches_inserts_and_unlocks():
    """One scan's candidates serve several evictions: a leaf touched since goes later, one
    inserted since goes in its turn, a leaf locked at the scan goes once unlocked."""
    tree = RadixCache()
    for first in (1, 2, 3, 4):
        tree.insert("", [first, first], np.array([2 * first, 2 * first + 1]))
    locked = tree.match_prefix("", [4, 4]).node
    tree.lock(locked)
    assert tree.evict(0).tolist() == []  # the scan
    tree.insert("", [5, 5], np.array([10, 11]))  # newer than every candidate
    tree.match_prefix("", [1, 1])  # newest now
    assert [tree.evict(1).tolist() for _ in range(3)] == [[4, 5], [6, 7], [10, 11]]
    tree.unlock(locked)  # least recent of those left
    assert [tree.evict(1).tolist() for _ in range(2)] == [[8, 9], [2, 3]]
    assert tree.evict(1).tolist() == [] and tree.size_info().total == 0


def test_lfu_keeps_the_frequently_hit():
    tree = RadixCache(policy="lfu")
    tree.insert("", [1], np.array([0]))
    tree.insert("", [2], np.array([1]))
    for _ in range(3):
        tree.match_prefix("", [1])
    tree.match_prefix("", [2])  # more recent, but fewer hits
    assert tree.evict(1).tolist() == [1]


def test_namespaces_never_share():
    tree = RadixCache()
    tree.insert("tenant-a", [1, 2, 3], slots_for(range(3), 0))
    assert tree.match_prefix("tenant-b", [1, 2, 3]).length == 0
    assert tree.match_prefix("tenant-a", [1, 2, 3]).length == 3
    existing, _ = tree.insert("tenant-b", [1, 2, 3], slots_for(range(3), 10))
    assert existing == 0 and tree.size_info().total == 6


def test_events_per_page_with_chained_hashes():
    events = []
    tree = RadixCache(page_size=2, on_event=lambda kind, ns, h: events.append((kind, ns, h)))
    toks = [1, 2, 3, 4, 5, 6]
    tree.insert("ns", toks, slots_for(toks, 0))
    tree.insert("ns", [1, 2, 3, 4, 9, 9], slots_for(toks, 10))
    full = block_hashes(toks, 2, "ns")
    assert events[0] == ("stored", "ns", full)
    assert events[1] == ("stored", "ns", block_hashes([1, 2, 3, 4, 9, 9], 2, "ns")[2:])
    tree.evict(100)
    removed = [h for kind, _, hs in events if kind == "removed" for h in hs]
    assert sorted(removed) == sorted(set(full) | set(events[1][2]))
    tree.insert("ns", [7, 7], np.array([0, 1]))
    tree.reset()
    assert events[-1] == ("cleared", "", []) and tree.size_info().total == 0


def test_reset_refused_while_locked():
    tree = RadixCache()
    _, node = tree.insert("", [1, 2], np.array([0, 1]))
    tree.lock(node)
    with pytest.raises(RuntimeError):
        tree.reset()


# -- property test against a naive model ------------------------------------------


def full_scan_evict(tree: RadixCache, num_tokens: int) -> list[int]:
    """What ``evict`` frees, found the simple way: every unlocked device leaf of the whole tree
    in a heap, least recently used first, a parent joining when its last device child goes."""
    heap = [(tree._priority(n), id(n), n) for n in tree.nodes()
            if n.on_device and n.lock_ref == 0 and not any(c.on_device for c in n.children.values())]
    heapq.heapify(heap)
    freed: list[int] = []
    while heap and len(freed) < num_tokens:
        _, _, leaf = heapq.heappop(heap)
        freed += leaf.value.tolist()
        parent = leaf.parent
        del parent.children[tree._page(leaf.key, 0)]
        if (not parent.is_root and parent.on_device and parent.lock_ref == 0
                and not any(c.on_device for c in parent.children.values())):
            heapq.heappush(heap, (tree._priority(parent), id(parent), parent))
    return freed

PAGE = 2
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.sampled_from(["a", "b"]),
                  st.lists(st.integers(0, 3), min_size=0, max_size=12)),
        st.tuples(st.just("lock"), st.sampled_from(["a", "b"]),
                  st.lists(st.integers(0, 3), min_size=0, max_size=12)),
        st.tuples(st.just("unlock"), st.integers(0, 10), st.just([])),
        st.tuples(st.just("evict"), st.integers(0, 12), st.just([])),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_random_operations_keep_invariants(operations):
    tree = RadixCache(page_size=PAGE)
    ref: dict[tuple[str, tuple[int, ...]], list[int]] = {}  # (ns, aligned prefix) -> its last page's slots
    locks = []
    next_slot = 0
    for op, arg, toks in operations:
        if op == "insert":
            slots = np.arange(next_slot, next_slot + len(toks))
            next_slot += len(toks)
            before = tree.size_info().total
            existing, _ = tree.insert(arg, toks, slots)
            aligned = len(toks) // PAGE * PAGE
            assert tree.size_info().total == before + aligned - existing
            for end in range(existing + PAGE, aligned + 1, PAGE):
                assert (arg, tuple(toks[:end])) not in ref
                ref[(arg, tuple(toks[:end]))] = slots[end - PAGE : end].tolist()
        elif op == "lock":
            m = tree.match_prefix(arg, toks)
            expected = 0
            while expected + PAGE <= len(toks) and (arg, tuple(toks[: expected + PAGE])) in ref:
                expected += PAGE
            assert m.length == expected
            want = [s for end in range(PAGE, expected + 1, PAGE) for s in ref[(arg, tuple(toks[:end]))]]
            assert m.slots.tolist() == want
            if m.length:
                before = tree.size_info()
                tree.lock(m.node)
                after = tree.size_info()
                assert after.total == before.total and after.protected >= before.protected
                locks.append(m.node)
        elif op == "unlock" and locks:
            tree.unlock(locks.pop(arg % len(locks)))
        elif op == "evict":
            before = tree.size_info()
            expected = full_scan_evict(copy.deepcopy(tree), arg)
            freed = tree.evict(arg)
            assert sorted(freed.tolist()) == sorted(expected)  # the same leaves as a scan of the tree
            assert len(set(freed.tolist())) == len(freed)
            assert tree.size_info().total == before.total - len(freed)
            assert len(freed) >= min(arg, before.evictable) or tree.size_info().evictable == 0
            gone = set(freed.tolist())
            removed = [k for k, page in ref.items() if gone & set(page)]
            for key in removed:
                assert set(ref[key]) <= gone  # whole pages only
                # only leaves go: nothing left in the tree extends an evicted prefix
                assert not any(k[0] == key[0] and k[1][: len(key[1])] == key[1]
                               for k in ref if k not in removed)
            for key in removed:
                del ref[key]
            assert tree.size_info().protected == before.protected
        tree.check_integrity()
        assert tree.size_info().total == len(ref) * PAGE
