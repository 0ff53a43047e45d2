"""The radix tree's node and the small types of its interface (matches, sizes, tiers)."""

from __future__ import annotations

import time
from typing import Callable, NamedTuple, Protocol

import numpy as np

from libs.protocol.hashing import namespace_hash

EventSink = Callable[..., None]  # (kind, namespace, block hashes[, "host"])
EMPTY = np.empty(0, np.int64)


class LowerTier(Protocol):
    """Where evicted pages may go instead of being dropped (the memory-tiers seam)."""

    num_free: int  # slots free in the tier
    exclusive: bool  # a node back on the device gives its copy in the tier up

    def copy_down(self, device_slots: np.ndarray, hashes: list[int] = ()) -> np.ndarray | None:
        """Take a copy of these device slots' KV (pages ``hashes``); its slots, or None to refuse."""

    def backs_up(self, hits: int) -> bool:
        """Copy a device node down ahead of eviction (write-through) once it has
        ``hits`` matches (0: when it is stored)."""

    def load(self, slots: np.ndarray, device_slots: np.ndarray) -> None:
        """Copy KV of these slots of the tier back into device slots."""

    def free(self, slots: np.ndarray) -> None:
        """Slots of this tier that the tree no longer needs."""


class TreeNode:
    __slots__ = ("parent", "children", "key", "value", "lower", "hashes", "lock_ref",
                 "last_access", "hits", "namespace")

    def __init__(self, parent: "TreeNode | None", key: np.ndarray, value: np.ndarray,
                 hashes: list[int], namespace: str) -> None:
        self.parent = parent
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.key = key  # token ids, int64, len % page_size == 0
        self.value: np.ndarray | None = value  # device KV slots, same length; None: not on device
        self.lower: np.ndarray | None = None  # the lower tier's slots, when it has a copy
        self.hashes = hashes  # one per page
        self.lock_ref = 0
        self.last_access = time.monotonic()
        self.hits = 0
        self.namespace = namespace

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def on_device(self) -> bool:
        return self.value is not None

    @property
    def last_hash(self) -> int:
        return self.hashes[-1] if self.hashes else namespace_hash(self.namespace)


class MatchResult(NamedTuple):
    node: TreeNode  # deepest matched device node: lock it to protect the device prefix
    slots: np.ndarray  # device KV slots of the matched prefix
    length: int  # tokens matched on the device
    lower_len: int = 0  # further tokens matched in the lower tier only
    lower: np.ndarray = EMPTY  # the lower tier's slots of those tokens


class SizeInfo(NamedTuple):
    evictable: int
    protected: int

    @property
    def total(self) -> int:
        return self.evictable + self.protected
