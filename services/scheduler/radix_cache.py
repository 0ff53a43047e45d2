"""Radix tree over token ids: which KV slots already hold which prefix.

Keys are page-aligned: every node holds a whole number of pages, matches stop
at page boundaries. Each namespace (cache salt / tenant) has its own root, so
identical tokens in two namespaces never share a node. Nodes locked by running
requests are protected; unlocked leaves are evicted LRU (or LFU) first.

Every page stored or removed is recorded with its chained block hash through
the ``on_event`` callback, so the cache index can mirror the tree.
"""

from __future__ import annotations

import heapq
import time
from typing import Callable, NamedTuple

import numpy as np

from libs.protocol.hashing import block_hashes, namespace_hash

EventSink = Callable[[str, str, list[int]], None]  # (kind, namespace, block hashes)


class TreeNode:
    __slots__ = ("parent", "children", "key", "value", "hashes", "lock_ref",
                 "last_access", "hits", "namespace")

    def __init__(self, parent: "TreeNode | None", key: np.ndarray, value: np.ndarray,
                 hashes: list[int], namespace: str) -> None:
        self.parent = parent
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.key = key  # token ids, int64, len % page_size == 0
        self.value = value  # KV slots, same length
        self.hashes = hashes  # one per page
        self.lock_ref = 0
        self.last_access = time.monotonic()
        self.hits = 0
        self.namespace = namespace

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def last_hash(self) -> int:
        return self.hashes[-1] if self.hashes else namespace_hash(self.namespace)


class MatchResult(NamedTuple):
    node: TreeNode  # deepest matched node: lock it to protect the whole prefix
    slots: np.ndarray  # KV slots of the matched prefix
    length: int


class SizeInfo(NamedTuple):
    evictable: int
    protected: int

    @property
    def total(self) -> int:
        return self.evictable + self.protected


class RadixCache:
    def __init__(self, page_size: int = 1, policy: str = "lru",
                 on_event: EventSink | None = None) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if policy not in ("lru", "lfu"):
            raise ValueError(f"unknown eviction policy {policy!r} (lru, lfu)")
        self.page_size = page_size
        self.policy = policy
        self.on_event = on_event or (lambda kind, ns, hashes: None)
        self._roots: dict[str, TreeNode] = {}
        self._evictable = 0
        self._protected = 0

    # -- queries ------------------------------------------------------------

    def match_prefix(self, namespace: str, tokens) -> MatchResult:
        """Longest cached page-aligned prefix of ``tokens`` in ``namespace``."""
        node, pos, parts = self._root(namespace), 0, []
        now = time.monotonic()
        for child, n in self._walk(namespace, self._aligned(tokens), split=True):
            child.last_access, child.hits = now, child.hits + 1
            parts.append(child.value)
            node, pos = child, pos + n
        slots = np.concatenate(parts) if parts else np.empty(0, np.int64)
        return MatchResult(node, slots, pos)

    def peek(self, namespace: str, tokens) -> tuple[int, TreeNode]:
        """Cached prefix length and the deepest node reached; changes nothing."""
        node, pos = self._root(namespace), 0
        for child, n in self._walk(namespace, self._aligned(tokens), split=False):
            node, pos = child, pos + n
        return pos, node

    def size_info(self) -> SizeInfo:
        return SizeInfo(self._evictable, self._protected)

    def all_hashes(self) -> list[int]:
        """Block hash of every cached page (for a snapshot of the tree)."""
        return [h for node in self._all_nodes() for h in node.hashes]

    # -- updates --------------------------------------------------------------

    def insert(self, namespace: str, tokens, slots: np.ndarray) -> tuple[int, TreeNode]:
        """Cache ``slots`` for the page-aligned part of ``tokens``.

        Returns (length already cached before this call, node of the end). The
        caller still owns its slots in [0, that length) that differ from the
        tree's and every slot past the aligned end: it frees them.
        """
        key = self._aligned(tokens)
        node, pos = self._root(namespace), 0
        now = time.monotonic()
        for child, n in self._walk(namespace, key, split=True):
            child.last_access = now
            node, pos = child, pos + n
        existing = pos
        if pos < len(key):
            node = self._add_leaf(node, key[pos:], np.asarray(slots[pos : len(key)], np.int64))
        return existing, node

    def lock(self, node: TreeNode) -> None:
        while not node.is_root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while not node.is_root:
            if node.lock_ref <= 0:
                raise RuntimeError("unlock of an unlocked node")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node = node.parent

    def evict(self, num_tokens: int) -> np.ndarray:
        """Remove unlocked leaves (least valuable first) until ``num_tokens`` slots
        are freed or nothing evictable is left; returns the freed slots."""
        heap = [(self._priority(n), id(n), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[np.ndarray] = []
        count = 0
        while heap and count < num_tokens:
            _, _, leaf = heapq.heappop(heap)
            freed.append(leaf.value)
            count += len(leaf.value)
            parent = self._remove_leaf(leaf)
            if not parent.is_root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (self._priority(parent), id(parent), parent))
        return np.concatenate(freed) if freed else np.empty(0, np.int64)

    def reset(self) -> np.ndarray:
        """Drop everything (refused while anything is locked); returns all slots."""
        if self._protected:
            raise RuntimeError("cannot clear the cache while requests hold it")
        slots = [n.value for n in self._all_nodes()]
        self._roots.clear()
        self._evictable = 0
        self.on_event("cleared", "", [])
        return np.concatenate(slots) if slots else np.empty(0, np.int64)

    def check_integrity(self) -> None:
        """Raise AssertionError if sizes, locks, alignment or hashes disagree."""
        evictable = protected = 0
        for node in self._all_nodes():
            assert len(node.key) == len(node.value) > 0 and len(node.key) % self.page_size == 0
            assert len(node.hashes) == len(node.key) // self.page_size
            assert node.hashes == block_hashes(node.key, self.page_size, parent=node.parent.last_hash)
            locked_children = sum(c.lock_ref for c in node.children.values())
            assert node.lock_ref >= locked_children >= 0
            for first, child in node.children.items():
                assert child.parent is node and tuple(child.key[: self.page_size]) == first
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert (evictable, protected) == (self._evictable, self._protected), (
            (evictable, protected), (self._evictable, self._protected))

    # -- internals --------------------------------------------------------------

    def _walk(self, namespace: str, key: np.ndarray, split: bool):
        """Yield (node, tokens matched in it) down the path of ``key``; with
        ``split`` a partly matched node is cut so the last one matches whole."""
        node, pos = self._root(namespace), 0
        while pos < len(key):
            child = node.children.get(self._page(key, pos))
            if child is None:
                return
            n = self._common(child.key, key[pos:])
            partial = n < len(child.key)
            if partial and split:
                child = self._split(child, n)
            yield child, n
            if partial:
                return
            node, pos = child, pos + n

    def _root(self, namespace: str) -> TreeNode:
        root = self._roots.get(namespace)
        if root is None:
            empty = np.empty(0, np.int64)
            root = self._roots[namespace] = TreeNode(None, empty, empty, [], namespace)
        return root

    def _aligned(self, tokens) -> np.ndarray:
        key = np.asarray(tokens, dtype=np.int64)
        return key[: len(key) // self.page_size * self.page_size]

    def _page(self, key: np.ndarray, pos: int) -> tuple[int, ...]:
        return tuple(key[pos : pos + self.page_size].tolist())

    def _common(self, a: np.ndarray, b: np.ndarray) -> int:
        n = min(len(a), len(b))
        diff = np.flatnonzero(a[:n] != b[:n])
        same = int(diff[0]) if len(diff) else n
        return same // self.page_size * self.page_size

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child`` after n tokens; returns the new upper node."""
        pages = n // self.page_size
        upper = TreeNode(child.parent, child.key[:n], child.value[:n], child.hashes[:pages],
                         child.namespace)
        upper.lock_ref, upper.last_access, upper.hits = child.lock_ref, child.last_access, child.hits
        child.parent.children[self._page(child.key, 0)] = upper
        child.key, child.value, child.hashes = child.key[n:], child.value[n:], child.hashes[pages:]
        child.parent = upper
        upper.children[self._page(child.key, 0)] = child
        return upper

    def _add_leaf(self, parent: TreeNode, key: np.ndarray, value: np.ndarray) -> TreeNode:
        hashes = block_hashes(key, self.page_size, parent=parent.last_hash)
        leaf = TreeNode(parent, key.copy(), value.copy(), hashes, parent.namespace)
        parent.children[self._page(key, 0)] = leaf
        self._evictable += len(key)
        self.on_event("stored", parent.namespace, hashes)
        return leaf

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode:
        parent = leaf.parent
        del parent.children[self._page(leaf.key, 0)]
        self._evictable -= len(leaf.key)
        self.on_event("removed", leaf.namespace, leaf.hashes)
        return parent

    def _priority(self, node: TreeNode) -> tuple:
        if self.policy == "lfu":
            return (node.hits, node.last_access)
        return (node.last_access,)

    def _leaves(self):
        return (n for n in self._all_nodes() if not n.children)

    def _all_nodes(self):
        stack = [c for r in self._roots.values() for c in r.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

