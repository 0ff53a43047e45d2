"""The host tier's books (L2): which host KV slots are free, and the copies owed.

The worker holds a second KV pool in host memory (``--host-kv-slots``); the
scheduler decides what lives there. Eviction demotes a device node here
(write-back: the copy down is made only when the device slots are needed), and a
request whose prefix continues in host memory loads it back at admission. Each
decision becomes a ``KVCopy`` that rides the next step's ForwardBatch; the worker
runs a step's copies in order before its forward, so:

- a d2h copy reads the device slots before this step's forward overwrites them
  (they were freed for it), and after every earlier step that wrote them;
- an h2d copy is complete before the forward that reads the loaded prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from libs.protocol.messages import KVCopy
from libs.transfer.store import page_key

from .allocator import SlotAllocator

PUT_MEMORY = 1 << 16  # page hashes put lately: not put again


@dataclass(frozen=True)
class StoreKeys:
    """How this worker's pages are named in the shared store (L3): a page copied down
    to the host is also put there under ``page_key(model, kv_dtype, its hash)``."""

    model: str
    kv_dtype: str
    page_tokens: int

    def keys(self, hashes: list[int]) -> list[str]:
        return [page_key(self.model, self.kv_dtype, h) for h in hashes]

    @property
    def prefix(self) -> str:
        """What every key of this worker's pages starts with (before the page hash)."""
        return page_key(self.model, self.kv_dtype, 0).rsplit(".", 1)[0]


WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")


class HostTier:
    """``write_policy`` (SGLang's): ``write_back`` copies a node down when it is
    evicted; ``write_through`` as soon as it is stored; ``write_through_selective``
    at its second hit, so only reused prefixes spend host bandwidth early.

    NOTE: with write_back the tier is exclusive: a node loaded back gives its host
    copy up (and is copied down again when next evicted), so device and host
    together hold as many documents as their sizes add up to; the write-through
    policies keep the copy (that is their point). With a shared store (``store``)
    every policy writes through: pages are put as soon as they are computed."""

    def __init__(self, num_slots: int, write_policy: str = "write_back",
                 store: StoreKeys | None = None) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"unknown host write policy {write_policy!r}; choose from {WRITE_POLICIES}")
        self.write_policy = write_policy
        self.slots = SlotAllocator(num_slots)
        self.store = store
        self._copies: list[KVCopy] = []
        self._put: OrderedDict[int, None] = OrderedDict()
        self.demoted = self.loaded = self.put = 0  # tokens copied down / back up / to the store

    @property
    def num_free(self) -> int:
        return self.slots.num_free

    @property
    def exclusive(self) -> bool:
        return self.write_policy == "write_back" and self.store is None

    def copy_down(self, device_slots: np.ndarray, hashes: list[int] = ()) -> np.ndarray | None:
        """Copy these device slots' KV to host slots (None: the host pool is full); with a
        shared store, its pages (``hashes``, one per page) go there too, from the host copy."""
        if len(device_slots) > self.slots.num_free:
            return None
        host = self.slots.alloc(len(device_slots))
        self._copies.append(KVCopy(kind="d2h", src=device_slots.tolist(), dst=host.tolist()))
        self.demoted += len(host)
        if self.store is not None and hashes:
            self._put_pages(host, list(hashes))
        return host

    def _put_pages(self, host: np.ndarray, hashes: list[int]) -> None:
        """A put of the pages not put lately (KV never changes: once is enough)."""
        fresh = [i for i, h in enumerate(hashes) if h not in self._put]
        if not fresh:
            return
        n = self.store.page_tokens
        src = np.concatenate([host[i * n : (i + 1) * n] for i in fresh])
        self._copies.append(KVCopy(kind="put", src=src.tolist(), keys=self.store.keys([hashes[i] for i in fresh])))
        for i in fresh:
            self._put[hashes[i]] = None
        while len(self._put) > PUT_MEMORY:
            self._put.popitem(last=False)
        self.put += len(src)

    def backs_up(self, hits: int) -> bool:
        # NOTE: with a shared store a page is put when it is computed (through its host
        # copy): a page reaches other workers only if it is there before its worker goes
        if self.write_policy == "write_through" or self.store is not None:
            return True
        return self.write_policy == "write_through_selective" and hits >= 2

    def load(self, host_slots: np.ndarray, device_slots: np.ndarray) -> None:
        """Copy host KV back into device slots (the host copy stays valid)."""
        self._copies.append(KVCopy(kind="h2d", src=host_slots.tolist(), dst=device_slots.tolist()))
        self.loaded += len(host_slots)

    def free(self, slots: np.ndarray) -> None:
        self.slots.free(slots)

    @property
    def owes_copies(self) -> bool:
        return bool(self._copies)

    def take_copies(self) -> list[KVCopy]:
        """The copies owed since the last call, in the order they were decided."""
        out, self._copies = self._copies, []
        return out
