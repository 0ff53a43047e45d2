"""The index's mirror ends equal to the scheduler's true tree after dropped events,
a restart (new epoch) and a flush; a real SchedulerCore produces the events."""

from __future__ import annotations


from services.cache_index.prefix_index import PrefixIndex
from tests.scheduler.test_core import branching_prompts, drain, make, req


def scheduler(page_size=4, kv_slots=300):
    return make(kv_slots=kv_slots, page_size=page_size, chunked_prefill_size=32)


def run(b, w, prompts, prefix="r"):
    for i, p in enumerate(prompts):
        b.submit(req(f"{prefix}{i}", prompt=p, max_new=4))
    drain(b, w)


def sync(index: PrefixIndex, b, drop=frozenset()) -> int:
    """Deliver the batcher's pending events (minus the dropped ones); snapshot on demand."""
    resyncs = 0
    batch = b.take_events()
    if batch is not None and batch.seq not in drop:
        if not index.on_events(batch):
            index.on_snapshot(b.snapshot())
            resyncs += 1
    elif batch is not None and index.needs_snapshot(b.info.worker_id):
        index.on_snapshot(b.snapshot())
    return resyncs


def truth(b) -> set[int]:
    return set(b.cache.tree.all_hashes())


def test_mirror_follows_events_step_by_step():
    b, w = scheduler()
    index = PrefixIndex()
    index.on_snapshot(b.snapshot())
    for i, p in enumerate(branching_prompts(30, seed=3)):
        b.submit(req(f"r{i}", prompt=p, max_new=3))
        batch = b.next_batch()
        if batch is not None:
            b.complete(w.run(batch))
        b.take_deltas()
        assert sync(index, b) == 0
        assert index.views["w1"].blocks == truth(b)
    assert index.resyncs == 1  # only the initial snapshot


def test_dropped_event_triggers_resync_and_converges():
    b, w = scheduler()
    index = PrefixIndex()
    index.on_snapshot(b.snapshot())
    prompts = branching_prompts(30, seed=4)
    dropped = False
    for i, p in enumerate(prompts):
        b.submit(req(f"r{i}", prompt=p, max_new=3))
        batch = b.next_batch()
        if batch is not None:
            b.complete(w.run(batch))
        events = b.take_events()
        if events is None:
            continue
        if not dropped and i > 5:
            dropped = True  # lost on the wire
            continue
        if not index.on_events(events):
            index.on_snapshot(b.snapshot())
    drain(b, w)
    events = b.take_events()
    if events is not None and not index.on_events(events):
        index.on_snapshot(b.snapshot())
    assert dropped and index.resyncs == 2
    assert index.views["w1"].blocks == truth(b)


def test_restart_and_flush_end_equal_to_the_tree():
    b, w = scheduler()
    index = PrefixIndex()
    index.on_snapshot(b.snapshot())
    run(b, w, branching_prompts(10, seed=5))
    sync(index, b)
    assert index.views["w1"].blocks == truth(b) != set()
    b.flush_cache()  # new epoch, "cleared" event
    sync(index, b)
    assert index.views["w1"].blocks == truth(b) == set()
    b2, w2 = scheduler()  # a restarted scheduler: new epoch, seq from 0
    run(b2, w2, branching_prompts(5, seed=6), prefix="n")
    sync(index, b2)
    assert index.views["w1"].blocks == truth(b2) != set()


def test_events_buffered_during_snapshot_are_replayed():
    b, w = scheduler()
    index = PrefixIndex()
    run(b, w, branching_prompts(5, seed=8))
    first = b.take_events()
    assert not index.on_events(first)  # unknown worker: needs a snapshot
    snap = b.snapshot()
    run(b, w, branching_prompts(5, seed=9), prefix="m")
    later = b.take_events()
    assert not index.on_events(later)  # buffered while the snapshot is on its way
    index.on_snapshot(snap)
    assert index.views["w1"].synced and index.views["w1"].blocks == truth(b)


def test_mirror_follows_the_host_tier_too():
    """Device and host sets both match the scheduler's tree while documents cycle
    through a small device pool into the host tier and back (and after a resync)."""
    b, w = make(kv_slots=160, page_size=4, chunked_prefill_size=32, host_slots=2048)
    index = PrefixIndex()
    docs = [list(range(100 + 60 * d, 140 + 60 * d)) for d in range(8)]
    for i in range(24):
        b.submit(req(f"r{i}", prompt=docs[i % 8] + [3 + i], max_new=3))
        while b.has_work():
            batch = b.next_batch()
            b.complete(w.run(batch))
            b.take_deltas()
            sync(index, b)
        view = index.views["w1"]
        assert view.blocks == truth(b) and view.host_blocks == set(b.cache.tree.host_hashes())
    assert b.host.loaded > 0 and view.host_blocks - view.blocks  # some pages only in host memory
    index.on_snapshot(b.snapshot())
    assert index.views["w1"].host_blocks == set(b.cache.tree.host_hashes())
