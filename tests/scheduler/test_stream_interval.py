"""--stream-interval: a request's tokens go out in groups, its first token and its finish at once."""

from __future__ import annotations

from services.scheduler.request import Req

from .test_core import drain, make, req
from .test_core import run_deltas as _deltas


def test_tokens_go_out_in_groups_and_the_output_is_unchanged():
    b1, w1 = make(enable_cache=False)
    b1.submit(req("a", max_new=8, ignore_eos=True))
    plain = drain(b1, w1)["a"]
    b, w = make(enable_cache=False, stream_interval=3)
    b.submit(req("a", max_new=8, ignore_eos=True))
    deltas = _deltas(b, w)
    assert [d.token_ids for d in deltas] == [plain[:1], plain[1:4], plain[4:7], plain[7:]]
    assert [d.finish_reason for d in deltas] == [None, None, None, "length"]
    assert deltas[-1].completion_tokens == 8


def test_a_finish_carries_the_tokens_held_back():
    b, w = make(enable_cache=False, stream_interval=4)
    b.submit(req("a", max_new=20, ignore_eos=True))
    deltas = []
    for _ in range(3):  # the prefill (first token out), then two decodes held back
        b.complete(w.run(b.next_batch()))
        deltas += [d for _, d in b.take_deltas()]
    assert [len(d.token_ids) for d in deltas] == [1]
    assert b.abort("a")
    deltas += _deltas(b, w)
    assert deltas[-1].finish_reason == "abort"
    assert len(deltas[-1].token_ids) == 2  # NOTE: the two held tokens, none lost
    assert deltas[-1].completion_tokens == 3


def test_eos_flushes_the_group_at_once():
    b1, w1 = make(enable_cache=False)
    b1.submit(req("a", max_new=30))
    plain = _deltas(b1, w1)
    b, w = make(enable_cache=False, stream_interval=16)
    b.submit(req("a", max_new=30))
    grouped = _deltas(b, w)
    assert [t for d in grouped for t in d.token_ids] == [t for d in plain for t in d.token_ids]
    assert grouped[-1].finish_reason == plain[-1].finish_reason


def test_a_resumed_request_sends_only_its_new_tokens():
    b, w = make(enable_cache=False, stream_interval=2)
    resumed = Req(rid="r", input_ids=list(range(10, 14)), output_ids=[50, 51], detok_instance="tok1",
                  sampling=req("x", max_new=5, ignore_eos=True).sampling)
    b.submit(resumed)
    deltas = _deltas(b, w)
    assert [len(d.token_ids) for d in deltas] == [1, 2]  # 3 new tokens: the first, then a group
    assert deltas[-1].finish_reason == "length" and deltas[-1].completion_tokens == 5


def test_logprobs_travel_with_their_tokens_group():
    b, w = make(enable_cache=False, stream_interval=3)
    b.submit(req("a", max_new=7, ignore_eos=True, return_logprob=True))
    deltas = _deltas(b, w)
    assert [len(d.token_ids) for d in deltas] == [1, 3, 3]
    for d in deltas:
        assert d.logprobs is not None and d.logprobs.token_ids == d.token_ids
        assert len(d.logprobs.logprobs) == len(d.token_ids)
