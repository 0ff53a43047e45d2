"""Mirror of every worker's prefix cache, kept from the schedulers' KV events.

Each worker's view is the set of block hashes it caches. Events arrive numbered
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
    blocks: set[int] = field(default_factory=set)
    synced: bool = False
    pending: list[KVEventBatch] = field(default_factory=list)
    updated: float = field(default_factory=time.monotonic)

    def apply(self, batch: KVEventBatch) -> None:
        for event in batch.events:
            if event.kind == "stored":
                self.blocks.update(event.block_hashes)
            elif event.kind == "removed":
                self.blocks.difference_update(event.block_hashes)
            else:
                self.blocks.clear()
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
        view.blocks = set(snap.block_hashes)
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
        """Leading pages of ``hashes`` (at this worker's page size) it holds or will
        hold (``extra``: page sets of requests just routed there), in tokens."""
        view = self.views.get(worker_id)
        blocks = view.blocks if view is not None and view.synced else set()
        matched = 0
        for h in hashes:
            if h not in blocks and not any(h in pages for pages in extra):
                break
            matched += 1
        return matched * self.page_size(worker_id)


def prompt_hashes(input_ids: list[int], salt: str, page_size: int) -> list[int]:
    """Pages of a prompt as routing sees them: all but its last token can be cached."""
    return block_hashes(input_ids[:-1], page_size, salt)
