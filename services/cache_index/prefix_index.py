"""Mirror of every worker's prefix cache, kept from the schedulers' KV events.

Each worker's view is the set of block hashes it caches on the device, and the set
it holds in its host tier (loaded back in milliseconds). Events arrive numbered
per (worker, epoch); a gap, a new epoch or an unknown worker makes the view
stale until a snapshot of the scheduler's tree replaces it. Events that arrive
while a snapshot is pending are buffered and replayed past the snapshot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from libs.protocol.hashing import block_hashes
from libs.protocol.messages import KVEventBatch, KVSnapshot


@dataclass
class WorkerView:
    epoch: int = -1
    next_seq: int = 0
    page_size: int = 1
    blocks: set[int] = field(default_factory=set)  # on the device
    host_blocks: set[int] = field(default_factory=set)  # with a copy in the host tier
    synced: bool = False
    pending: list[KVEventBatch] = field(default_factory=list)
    updated: float = field(default_factory=time.monotonic)

    def apply(self, batch: KVEventBatch) -> None:
        for event in batch.events:
            blocks = self.host_blocks if event.medium == "host" else self.blocks
            if event.kind == "stored":
                blocks.update(event.block_hashes)
            elif event.kind == "removed":
                blocks.difference_update(event.block_hashes)
            else:
                self.blocks.clear()
                self.host_blocks.clear()
        self.next_seq = batch.seq + len(batch.events)
        self.updated = time.monotonic()


class PrefixIndex:
    def __init__(self) -> None:
        self.views: dict[str, WorkerView] = {}
        self.resyncs = 0

    def on_events(self, batch: KVEventBatch) -> bool:
        """Apply ``batch``; False when the worker's view needs a snapshot."""
        view = self.views.setdefault(batch.worker_id, WorkerView())
        if not view.synced:
            view.pending.append(batch)
            return False
        if batch.epoch != view.epoch or batch.seq != view.next_seq:
            if batch.epoch == view.epoch and batch.seq < view.next_seq:
                return True  # an old duplicate: already applied
            view.synced = False
            view.pending = [batch]
            return False
        view.apply(batch)
        return True

    def on_snapshot(self, snap: KVSnapshot) -> None:
        view = self.views.setdefault(snap.worker_id, WorkerView())
        view.epoch, view.page_size = snap.epoch, snap.page_size
        view.blocks, view.host_blocks = set(snap.block_hashes), set(snap.host_hashes)
        view.next_seq, view.synced = snap.seq, True
        view.updated = time.monotonic()
        self.resyncs += 1
        pending, view.pending = view.pending, []
        for batch in sorted(pending, key=lambda b: b.seq):
            if batch.epoch == snap.epoch and batch.seq >= view.next_seq:
                if batch.seq != view.next_seq:
                    view.synced = False  # a hole even after the snapshot
                    view.pending = [batch]
                    return
                view.apply(batch)

    def needs_snapshot(self, worker_id: str) -> bool:
        view = self.views.get(worker_id)
        return view is None or not view.synced

    def drop(self, worker_id: str) -> None:
        self.views.pop(worker_id, None)

    def page_size(self, worker_id: str) -> int:
        view = self.views.get(worker_id)
        return view.page_size if view is not None and view.synced else self.default_page_size

    @property
    def default_page_size(self) -> int:
        sizes = [v.page_size for v in self.views.values() if v.synced]
        return max(set(sizes), key=sizes.count) if sizes else 16

    def cached_tokens(self, worker_id: str, hashes: list[int],
                      extra: list[frozenset[int]] = ()) -> int:
        """Leading pages of ``hashes`` (at this worker's page size) it holds on the
        device or will (``extra``: page sets of requests just routed there), in tokens."""
        return self.cached_split(worker_id, hashes, extra)[0]

    def cached_split(self, worker_id: str, hashes: list[int],
                     extra: list[frozenset[int]] = ()) -> tuple[int, int]:
        """(device tokens, host-tier tokens right after them) of ``hashes``' leading pages."""
        view = self.views.get(worker_id)
        synced = view is not None and view.synced
        blocks = view.blocks if synced else set()
        host = view.host_blocks if synced else set()
        device = lower = 0
        for h in hashes:
            if not lower and (h in blocks or any(h in pages for pages in extra)):
                device += 1
            elif h in host:
                lower += 1
            else:
                break
        page = self.page_size(worker_id)
        return device * page, lower * page


def prompt_hashes(input_ids: list[int], salt: str, page_size: int) -> list[int]:
    """Pages of a prompt as routing sees them: all but its last token can be cached."""
    return block_hashes(input_ids[:-1], page_size, salt)
