"""Order of the waiting queue: fcfs, lpm (longest cached prefix first), dfs-weight.

lpm and dfs-weight look requests up in the radix tree, so above
``MAX_CACHE_AWARE`` waiting requests they fall back to fcfs (as SGLang does).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from .cache import KVCache
from .request import Req

POLICIES = ("fcfs", "lpm", "dfs-weight")
MAX_CACHE_AWARE = 128


def order(policy: str, waiting: Sequence[Req], cache: KVCache) -> list[Req]:
    if policy not in POLICIES:
        raise ValueError(f"unknown schedule policy {policy!r}; choose from {POLICIES}")
    if policy == "fcfs" or cache.tree is None or len(waiting) > MAX_CACHE_AWARE:
        return list(waiting)
    if policy == "lpm":
        lengths = {id(r): cache.reusable_len(r) for r in waiting}
        return sorted(waiting, key=lambda r: -lengths[id(r)])  # stable: fcfs among ties
    return _dfs_weight(waiting, cache)


def _dfs_weight(waiting: Sequence[Req], cache: KVCache) -> list[Req]:
    """Visit the tree depth first, heavier subtrees (more waiting requests) first,
    so requests sharing a prefix run back to back while it is cached."""
    at_node: dict[int, list[Req]] = defaultdict(list)
    weight: dict[int, int] = defaultdict(int)
    roots: dict[int, object] = {}
    for req in waiting:
        node = cache.match(req).node
        at_node[id(node)].append(req)
        while node is not None:
            weight[id(node)] += 1
            if node.parent is None:
                roots[id(node)] = node
            node = node.parent
    out: list[Req] = []
    stack = sorted(roots.values(), key=lambda n: weight[id(n)])
    while stack:
        node = stack.pop()
        out.extend(at_node.get(id(node), ()))
        children = [c for c in node.children.values() if weight.get(id(c))]
        stack.extend(sorted(children, key=lambda c: weight[id(c)]))
    return out
