"""The host tier (L2) on the slot-reading worker: evictions demote, admissions load
back, the copies ride the step in order, and outputs never change."""

from __future__ import annotations

import pytest

from .test_core import assert_all_slots_back, branching_prompts, drain, make, req, run_workload
from .test_overlap import both, submit_prompts


def test_an_evicted_document_comes_back_from_host_memory():
    b, w = make(kv_slots=64, host_slots=256, page_size=4)
    doc = list(range(100, 148))
    b.submit(req("first", prompt=doc + [1], max_new=2))
    drain(b, w)
    b.submit(req("other", prompt=list(range(300, 350)), max_new=2))  # pushes the document out
    drain(b, w)
    assert b.host.demoted >= 48 and b.cache.prefix_len(req("x", prompt=doc + [2])) == 0
    b.submit(req("again", prompt=doc + [2], max_new=2))
    batch = b.next_batch()
    loads = [c for c in batch.copies if c.kind == "h2d"]
    assert sum(len(c.dst) for c in loads) == 48  # the whole document, loaded not recomputed
    assert batch.prefix_lens == [48] and batch.extend_lens == [1]
    b.complete(w.run(batch))
    drain(b, w)
    assert b.stats().cached_tokens == 48
    assert_all_slots_back(b)


def cyclic_documents(n_docs=6, doc_len=40, rounds=4) -> list[list[int]]:
    """Questions over documents asked in a cycle: the working set outgrows the device pool."""
    docs = [list(range(100 + 50 * d, 100 + 50 * d + doc_len)) for d in range(n_docs)]
    return [docs[i % n_docs] + [3 + i % 7, 5 + i] for i in range(n_docs * rounds)]


def run_waves(prompts, wave=4, **cfg):
    """Submit ``wave`` requests at a time, each wave after the last one finished."""
    b, w = make(**cfg)
    outputs = {}
    for start in range(0, len(prompts), wave):
        for i in range(start, min(start + wave, len(prompts))):
            b.submit(req(f"r{i}", prompt=prompts[i], max_new=4 + i % 3))
        outputs |= drain(b, w)
    assert_all_slots_back(b)
    return outputs, b


def test_a_cyclic_working_set_larger_than_the_device_loads_back_instead_of_recomputing():
    prompts = cyclic_documents()
    reference, _ = run_waves(prompts, enable_cache=False, kv_slots=4096)
    plain, without = run_waves(prompts, kv_slots=128, page_size=4)
    tiered, tier = run_waves(prompts, kv_slots=128, page_size=4, host_slots=1024)
    assert plain == tiered == reference
    # NOTE: write-back is exclusive: every load-back was copied down first
    assert tier.host.loaded >= 100 and tier.host.demoted >= tier.host.loaded
    _, through = run_waves(prompts, kv_slots=128, page_size=4, host_slots=1024,
                           host_write_policy="write_through")
    assert through.host.demoted < through.host.loaded  # inclusive: a copy is made once
    assert tier.stats().cached_tokens > 2 * without.stats().cached_tokens


@pytest.mark.parametrize("cfg", [
    dict(kv_slots=160, max_requests=8, chunked_prefill_size=16),
    dict(kv_slots=120, max_requests=8, chunked_prefill_size=16, page_size=4,
         init_new_token_ratio=0.0, min_new_token_ratio=0.0),  # retracts too
    dict(kv_slots=400, chunked_prefill_size=16, retract_interval=3, schedule_policy="lpm"),
])
def test_outputs_identical_with_the_host_tier(cfg):
    prompts = branching_prompts(40, seed=7)
    reference, _ = run_workload(prompts, enable_cache=False, kv_slots=4096)
    out, _ = run_workload(prompts, host_slots=2048, **cfg)
    assert out == reference
    cyclic = cyclic_documents(n_docs=12, rounds=2)  # 12 x 42 tokens: more than any pool here
    waves, tiered = run_waves(cyclic, host_slots=2048, **cfg)
    assert waves == run_waves(cyclic, enable_cache=False, kv_slots=4096)[0]
    assert tiered.host.demoted > 0


def test_a_small_host_pool_refuses_and_drops_instead():
    out, stats = run_workload(branching_prompts(40, seed=3), host_slots=24, kv_slots=160,
                              max_requests=8, chunked_prefill_size=16)
    reference, _ = run_workload(branching_prompts(40, seed=3), enable_cache=False, kv_slots=4096)
    assert out == reference


def test_copies_ride_steps_sent_ahead():
    sync, ahead = both(submit_prompts(branching_prompts(40, seed=11)), kv_slots=160,
                       max_requests=8, chunked_prefill_size=16, host_slots=1024)
    ahead.pop("_ahead")
    assert ahead == sync


@pytest.mark.parametrize("policy", ["write_back", "write_through", "write_through_selective"])
def test_write_policies_keep_outputs_and_copy_when_they_say(policy):
    prompts = cyclic_documents(n_docs=12, rounds=2)
    reference, _ = run_waves(prompts, enable_cache=False, kv_slots=4096)
    tight, tiered = run_waves(prompts, kv_slots=160, page_size=4, host_slots=2048,
                              host_write_policy=policy)
    assert tight == reference and tiered.host.loaded > 0
    # with room for everything nothing is evicted: only write-through copies down
    _, roomy = run_waves(cyclic_documents(n_docs=12, rounds=3), kv_slots=4096, page_size=4,
                         host_slots=8192, host_write_policy=policy)
    stored = roomy.cache.tree.size_info().total
    copied = roomy.host.demoted
    if policy == "write_back":
        assert copied == 0
    elif policy == "write_through":
        assert copied == stored  # every cached token has its host copy
    else:
        assert 0 < copied < stored  # only prefixes matched twice (the documents, third round)


def test_tenants_never_load_each_others_pages_from_host_memory():
    b, w = make(kv_slots=64, host_slots=512, page_size=4)
    doc = list(range(100, 148))
    b.submit(req("a", prompt=doc + [1], max_new=2, ns="tenant-a"))
    drain(b, w)
    b.submit(req("push", prompt=list(range(300, 350)), max_new=2, ns="tenant-a"))
    drain(b, w)  # tenant-a's document is now in host memory only
    assert b.cache.match(req("x", prompt=doc + [2], ns="tenant-a")).lower_len == 48
    b.submit(req("b", prompt=doc + [2], max_new=2, ns="tenant-b"))
    batch = b.next_batch()
    assert not [c for c in batch.copies if c.kind == "h2d"]  # computed, never loaded
    assert batch.prefix_lens == [0]
    b.complete(w.run(batch))
    drain(b, w)
    assert b.host.loaded == 0
    assert_all_slots_back(b)
