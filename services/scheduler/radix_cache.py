"""Radix tree over token ids: which KV slots already hold which prefix.

Keys are page-aligned: every node holds a whole number of pages, matches stop
at page boundaries. Each namespace (cache salt / tenant) has its own root, so
identical tokens in two namespaces never share a node. Nodes locked by running
requests are protected; unlocked device leaves are evicted LRU (or LFU) first.

Tiers: a node's KV is on the device (``value``) or only in a lower tier
(``lower``); device nodes form a prefix-closed subtree, so a match is a device
part then a lower part. Eviction demotes through a ``LowerTier`` (the node
stays) or, without one or when it refuses, drops the node and all below it.

Every page stored or removed is recorded with its chained block hash through
the ``on_event`` callback, so the cache index can mirror the tree: device events
as (kind, namespace, hashes), the lower tier's with a fourth argument "host"; a
page going down is stored there before it is removed from the device.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter

import numpy as np

from libs.protocol.hashing import block_hashes

from .tree_check import check_tree
from .tree_node import EMPTY, EventSink, LowerTier, MatchResult, SizeInfo, TreeNode

class RadixCache:
    def __init__(self, page_size: int = 1, policy: str = "lru",
                 on_event: EventSink | None = None, tier: LowerTier | None = None) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if policy not in ("lru", "lfu"):
            raise ValueError(f"unknown eviction policy {policy!r} (lru, lfu)")
        self.page_size = page_size
        self.policy = policy
        self.on_event = on_event or (lambda *event: None)
        self.tier = tier
        self._roots: dict[str, TreeNode] = {}
        self._evictable = 0
        self._protected = 0
        self.pinned: Counter[int] = Counter()  # lower-tier pages kept for a queued request (hashes)
        # eviction candidates: the device leaves of the last scan, a heap by priority (LRU only)
        self._candidates: list | None = None
        self._scanned_at = 0.0

    # -- queries ------------------------------------------------------------

    def match_prefix(self, namespace: str, tokens) -> MatchResult:
        """Longest cached page-aligned prefix of ``tokens`` in ``namespace``."""
        node, pos, lower, parts, lower_parts = self._root(namespace), 0, 0, [], []
        now = time.monotonic()
        for child, n in self._walk(namespace, self._aligned(tokens), split=True):
            child.last_access, child.hits = now, child.hits + 1
            if not child.on_device or lower:
                lower += n
                lower_parts.append(child.lower)
                continue
            if self.tier is not None and self.tier.backs_up(child.hits):
                self._back_up(child)
            parts.append(child.value)
            node, pos = child, pos + n
        slots = np.concatenate(parts) if parts else EMPTY
        return MatchResult(node, slots, pos, lower, np.concatenate(lower_parts) if lower else EMPTY)

    def peek(self, namespace: str, tokens) -> MatchResult:
        """Like :meth:`match_prefix` (no slots) but changes nothing: no split, no touch."""
        node, pos, lower = self._root(namespace), 0, 0
        for child, n in self._walk(namespace, self._aligned(tokens), split=False):
            if not child.on_device or lower:
                lower += n
            else:
                node, pos = child, pos + n
        return MatchResult(node, EMPTY, pos, lower)

    def size_info(self) -> SizeInfo:
        return SizeInfo(self._evictable, self._protected)

    def all_hashes(self) -> list[int]:
        """Block hash of every page on the device (for a snapshot of the tree)."""
        return [h for node in self._all_nodes() if node.on_device for h in node.hashes]

    def host_hashes(self) -> list[int]:
        """Block hash of every page with a copy in the lower tier."""
        return [h for node in self._all_nodes() if node.lower is not None for h in node.hashes]

    # -- updates --------------------------------------------------------------

    def insert(self, namespace: str, tokens, slots: np.ndarray) -> tuple[int, TreeNode]:
        """Cache ``slots`` for the page-aligned part of ``tokens``.

        Returns (length already on the device before this call, node of the end).
        The caller still owns its slots in [0, that length) that differ from the
        tree's and every slot past the aligned end: it frees them. Nodes it passes
        that sit only in the lower tier go back on the device with its slots.
        """
        key = self._aligned(tokens)
        node, pos, existing = self._root(namespace), 0, -1
        now = time.monotonic()
        for child, n in self._walk(namespace, key, split=True):
            child.last_access = now
            if not child.on_device:
                existing = pos if existing < 0 else existing
                self._promote(child, np.asarray(slots[pos : pos + n], np.int64).copy())
            node, pos = child, pos + n
        existing = pos if existing < 0 else existing
        if pos < len(key):
            node = self._add_leaf(node, key[pos:], np.asarray(slots[pos : len(key)], np.int64))
        return existing, node

    def insert_lower(self, namespace: str, tokens, start: int, lower: np.ndarray) -> tuple[int, int]:
        """Pages [start, len) of ``tokens`` arrived in the lower tier's slots ``lower``
        (from the shared store): those the tree lacks become a lower-tier leaf. Returns
        (skip, used): the first ``skip`` tokens were in the tree already (put there
        meanwhile: another fetch of a document with the same opening, a prefill), the next
        ``used`` joined it; the caller frees the other slots. (0, 0) when the path up to
        ``start`` left the tree meanwhile."""
        key = self._aligned(tokens)
        node, pos = self._root(namespace), 0
        for child, n in self._walk(namespace, key, split=True):
            node, pos = child, pos + n
        if pos < start:
            return 0, 0
        if pos >= len(key):
            return len(key) - start, 0
        leaf = TreeNode(node, key[pos:].copy(), None, block_hashes(key[pos:], self.page_size,
                                                                     parent=node.last_hash), namespace)
        leaf.lower = np.asarray(lower[pos - start:], np.int64).copy()
        node.children[self._page(key, pos)] = leaf
        self.on_event("stored", namespace, leaf.hashes, "host")
        return pos - start, len(key) - pos

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
        """Take unlocked device leaves (least valuable first) off the device until
        ``num_tokens`` slots are freed or nothing evictable is left: demoted to the
        lower tier where it takes them, else dropped. Returns the freed device slots."""
        if self._candidates is None or self.policy != "lru":
            self._scan()
        held: list = []
        freed: list[np.ndarray] = []
        count = 0
        while count < num_tokens:
            leaf = self._victim(held)
            if leaf is None:
                break
            freed.append(leaf.value)
            count += len(leaf.value)
            self._evictable -= len(leaf.key)
            parent = leaf.parent
            # NOTE: a copy made earlier is still valid: KV never changes
            if leaf.lower is None and self.tier is not None:
                self._copy_down(leaf)
            if leaf.lower is None:
                self._drop(leaf)
            else:
                leaf.value = None
                self.on_event("removed", leaf.namespace, leaf.hashes)
            if self._is_device_leaf(parent):
                heapq.heappush(self._candidates, (self._priority(parent), id(parent), parent))
        for entry in held:  # NOTE: locked now, evictable once unlocked: they stay candidates
            heapq.heappush(self._candidates, entry)
        return np.concatenate(freed) if freed else EMPTY

    def _scan(self) -> None:
        """Every device leaf as a candidate (locked ones too: unlocked later, they are due)."""
        self._scanned_at = time.monotonic()
        self._candidates = [(self._priority(n), id(n), n) for n in self._device_leaves()]
        heapq.heapify(self._candidates)

    def _victim(self, held: list) -> TreeNode | None:
        """The least valuable unlocked device leaf, or None. NOTE: a scan of the whole tree per
        eviction cost a full cache O(tree) per step; one scan's candidates serve until those
        older than it are used up (LRU: a node touched or made a leaf since is newer, or was
        pushed when its last child went), each checked as it comes out."""
        rescanned = False
        while True:
            heap = self._candidates
            stale = self.policy == "lru" and heap and heap[0][0][0] >= self._scanned_at
            if (not heap or stale) and not rescanned:
                self._scan()
                held.clear()  # NOTE: the scan has them again
                rescanned = True
                continue
            if not heap:
                return None
            node = self._pop_valid(held)
            if node is not None:
                return node

    def _pop_valid(self, held: list) -> TreeNode | None:
        priority, _, node = entry = heapq.heappop(self._candidates)
        if not self._in_tree(node) or not self._is_device_leaf(node):
            return None  # NOTE: evicted, dropped or no longer a leaf: pushed again if it becomes one
        if node.lock_ref:
            held.append(entry)
            return None
        now = self._priority(node)
        if now != priority:  # touched since: back in at its place
            heapq.heappush(self._candidates, (now, id(node), node))
            return None
        return node

    def _in_tree(self, node: TreeNode) -> bool:
        parent = node.parent
        return parent is not None and parent.children.get(self._page(node.key, 0)) is node

    def evict_lower(self, num_tokens: int) -> int:
        """Drop lower-tier-only leaves (least valuable first) until ``num_tokens`` of
        the tier's slots are free again; returns how many were freed.
        NOTE: call it between steps only: a node matched for a load-back in the
        step being planned must not go."""
        heap = [(self._priority(n), id(n), n) for n in self._all_nodes()
                if not n.on_device and not n.children and not self._is_pinned(n)]
        heapq.heapify(heap)
        count = 0
        while heap and count < num_tokens:
            _, _, leaf = heapq.heappop(heap)
            count += len(leaf.key)
            parent = leaf.parent
            self._drop(leaf)
            if (not parent.is_root and not parent.on_device and not parent.children
                    and not self._is_pinned(parent)):
                heapq.heappush(heap, (self._priority(parent), id(parent), parent))
        return count

    def pin(self, hashes: list[int]) -> None:
        """Keep these lower-tier pages out of :meth:`evict_lower` (fetched for a request
        that has not started yet) until :meth:`unpin`."""
        self.pinned.update(hashes)

    def unpin(self, hashes: list[int]) -> None:
        self.pinned.subtract(hashes)
        for h in hashes:
            if self.pinned[h] <= 0:
                del self.pinned[h]

    def _is_pinned(self, node: TreeNode) -> bool:
        return bool(self.pinned) and any(h in self.pinned for h in node.hashes)

    def reset(self) -> np.ndarray:
        """Drop everything (refused while anything is locked); returns the device slots."""
        if self._protected:
            raise RuntimeError("cannot clear the cache while requests hold it")
        nodes = list(self._all_nodes())
        self._free_lower(nodes)
        slots = [n.value for n in nodes if n.on_device]
        self._roots.clear()
        self._candidates = None
        self._evictable = 0
        self.on_event("cleared", "", [])
        return np.concatenate(slots) if slots else EMPTY

    def check_integrity(self) -> None:
        """Raise AssertionError if sizes, locks, tiers, alignment or hashes disagree."""
        check_tree(self)

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
        value, lower = child.value, child.lower
        upper = TreeNode(child.parent, child.key[:n], None if value is None else value[:n],
                         child.hashes[:pages], child.namespace)
        upper.lower = None if lower is None else lower[:n]
        upper.lock_ref, upper.last_access, upper.hits = child.lock_ref, child.last_access, child.hits
        child.parent.children[self._page(child.key, 0)] = upper
        child.key, child.hashes = child.key[n:], child.hashes[pages:]
        child.value = None if value is None else value[n:]
        child.lower = None if lower is None else lower[n:]
        child.parent = upper
        upper.children[self._page(child.key, 0)] = child
        return upper

    def _add_leaf(self, parent: TreeNode, key: np.ndarray, value: np.ndarray) -> TreeNode:
        hashes = block_hashes(key, self.page_size, parent=parent.last_hash)
        leaf = TreeNode(parent, key.copy(), value.copy(), hashes, parent.namespace)
        parent.children[self._page(key, 0)] = leaf
        self._evictable += len(key)
        self.on_event("stored", parent.namespace, hashes)
        if self.tier is not None and self.tier.backs_up(0):
            self._back_up(leaf)
        return leaf

    def _promote(self, node: TreeNode, slots: np.ndarray) -> None:
        """A lower-tier node is back on the device in ``slots``."""
        node.value = slots
        self._evictable += len(slots)
        self.on_event("stored", node.namespace, node.hashes)
        if self.tier.exclusive:
            self._free_lower([node])
            self.on_event("removed", node.namespace, node.hashes, "host")
            node.lower = None

    def _back_up(self, node: TreeNode) -> None:
        """A copy in the lower tier while the node stays on the device (write-through).
        NOTE: copies run before the next step's forward, after the one writing it."""
        if node.lower is None:
            self._copy_down(node)

    def _copy_down(self, node: TreeNode) -> None:
        node.lower = self.tier.copy_down(node.value, node.hashes)
        if node.lower is not None:
            self.on_event("stored", node.namespace, node.hashes, "host")

    def _drop(self, node: TreeNode) -> None:
        """Remove ``node`` (off the device or a device leaf) and the lower-tier
        nodes below it."""
        del node.parent.children[self._page(node.key, 0)]
        stack, gone = [node], []
        while stack:
            gone.append(stack.pop())
            stack.extend(gone[-1].children.values())
        self._free_lower(gone)
        for n in gone:
            if n.on_device:
                self.on_event("removed", n.namespace, n.hashes)
            if n.lower is not None:
                self.on_event("removed", n.namespace, n.hashes, "host")

    def _free_lower(self, nodes: list[TreeNode]) -> None:
        held = [n.lower for n in nodes if n.lower is not None]
        if held and self.tier is not None:
            self.tier.free(np.concatenate(held))

    def _priority(self, node: TreeNode) -> tuple:
        if self.policy == "lfu":
            return (node.hits, node.last_access)
        return (node.last_access,)

    def _is_device_leaf(self, node: TreeNode) -> bool:
        return (not node.is_root and node.on_device
                and not any(c.on_device for c in node.children.values()))

    def _device_leaves(self):
        return (n for n in self._all_nodes() if self._is_device_leaf(n))

    def nodes(self):
        """Every node below the roots (any order)."""
        return self._all_nodes()

    def _all_nodes(self):
        stack = [c for r in self._roots.values() for c in r.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

