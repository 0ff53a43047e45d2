"""Per-step batch handling of detok streams (no bus)."""

from __future__ import annotations

import pytest

from libs.protocol.messages import DetokBatch, ErrorInfo, TokenDelta, Usage
from services.tokenizer.detok import Detokenizer
from services.tokenizer.streams import Streams


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def clock() -> Clock:
    return Clock()


@pytest.fixture()
def streams(tokenizer, clock) -> Streams:
    return Streams(Detokenizer(tokenizer), clock)


def batch(*items: TokenDelta) -> DetokBatch:
    return DetokBatch(worker_id="w1", step=1, items=list(items))


def test_deltas_are_grouped_per_gateway_and_unknown_rids_ignored(streams, tokenizer):
    streams.open("a", "gw-1", 5, [], True)
    streams.open("b", "gw-2", 6, [], True)
    streams.open("c", "gw-1", 7, [], True)
    hi, yo = tokenizer.encode("Hi"), tokenizer.encode("Yo")
    out = streams.step(batch(
        TokenDelta(rid="a", token_ids=hi), TokenDelta(rid="ghost", token_ids=hi),
        TokenDelta(rid="b", token_ids=yo), TokenDelta(rid="c", token_ids=yo),
    ))
    assert sorted(out.per_gateway) == ["gw-1", "gw-2"]
    assert [(d.rid, d.text) for d in out.per_gateway["gw-1"]] == [("a", "Hi"), ("c", "Yo")]
    assert [(d.rid, d.text) for d in out.per_gateway["gw-2"]] == [("b", "Yo")]
    assert not out.aborts and len(streams) == 3


def test_held_text_still_forwards_token_ids_and_empty_deltas_are_skipped(streams, tokenizer):
    ids = tokenizer.encode("👍")
    streams.open("a", "gw-1", 3, [], True)
    first = streams.step(batch(TokenDelta(rid="a", token_ids=ids[:1])))
    assert [(d.text, d.token_ids) for d in first.per_gateway["gw-1"]] == [("", ids[:1])]
    assert streams.step(batch(TokenDelta(rid="a", token_ids=[]))).per_gateway == {}
    rest = streams.step(batch(TokenDelta(rid="a", token_ids=ids[1:])))
    assert rest.per_gateway["gw-1"][0].text == "👍"


def test_scheduler_finish_flushes_held_text_with_usage(streams, tokenizer):
    streams.open("a", "gw-1", 11, ["STOP"], True)
    first, last = tokenizer.encode("go S"), tokenizer.encode("TO")
    assert streams.step(batch(TokenDelta(rid="a", token_ids=first))).per_gateway["gw-1"][0].text == "go "
    out = streams.step(batch(TokenDelta(
        rid="a", token_ids=last, finish_reason="length", completion_tokens=0, cached_tokens=4,
    )))
    (final,) = out.per_gateway["gw-1"]
    assert (final.text, final.finish_reason) == ("STO", "length")
    assert final.usage == Usage(prompt_tokens=11, completion_tokens=len(first) + len(last),
                                cached_tokens=4)
    assert "a" not in streams and not out.aborts


def test_the_cached_split_per_tier_reaches_the_usage(streams, tokenizer):
    streams.open("a", "gw-1", 40, ["###"], True)
    ids = tokenizer.encode("done ### more")  # NOTE: a stop string ends it before the scheduler's finish
    out = streams.step(batch(TokenDelta(rid="a", token_ids=ids, cached_tokens=32,
                                        cached_host_tokens=16, cached_store_tokens=12)))
    (final,) = out.per_gateway["gw-1"]
    assert final.usage == Usage(prompt_tokens=40, completion_tokens=len(ids), cached_tokens=32,
                                cached_host_tokens=16, cached_store_tokens=12)


def test_stop_string_finishes_and_asks_for_abort(streams, tokenizer):
    streams.open("a", "gw-1", 9, ["###"], True)
    ids = tokenizer.encode("done ### more")
    out = streams.step(batch(TokenDelta(rid="a", token_ids=ids, cached_tokens=2)))
    (final,) = out.per_gateway["gw-1"]
    assert (final.text, final.finish_reason, final.error) == ("done ", "stop", None)
    assert final.usage == Usage(prompt_tokens=9, completion_tokens=len(ids), cached_tokens=2)
    assert out.aborts == {"a": "stop"} and "a" not in streams
    # the scheduler's late abort ack for the same rid is ignored
    assert streams.step(batch(TokenDelta(rid="a", token_ids=[], finish_reason="abort"))).per_gateway == {}


def test_error_finish_carries_the_error(streams, tokenizer):
    streams.open("a", "gw-1", 2, [], True)
    info = ErrorInfo(code="internal_error", message="worker died", status=500)
    out = streams.step(batch(TokenDelta(rid="a", token_ids=[], finish_reason="error", error=info)))
    (final,) = out.per_gateway["gw-1"]
    assert (final.finish_reason, final.error, final.text) == ("error", info, "")
    assert final.usage == Usage(prompt_tokens=2, completion_tokens=0)


def test_undecodable_ids_end_the_request_with_error(streams):
    streams.open("a", "gw-1", 2, [], True)
    out = streams.step(batch(TokenDelta(rid="a", token_ids=[-4])))
    (final,) = out.per_gateway["gw-1"]
    assert final.finish_reason == "error" and final.error.code == "internal_error"
    assert out.aborts == {"a": "error"}


def test_release_and_idle_sweep(streams, clock, tokenizer):
    for rid in "abc":
        streams.open(rid, "gw-1", 1, [], True)
    assert streams.release(["a", "zzz"]) == 1
    clock.now += 50
    streams.step(batch(TokenDelta(rid="b", token_ids=tokenizer.encode("x"))))
    clock.now += 20
    assert streams.sweep(idle_timeout=60) == ["c"]
    assert "b" in streams and len(streams) == 1


def test_numbered_deltas_in_order_pass_repeats_drop_and_a_gap_ends_the_stream(streams, tokenizer):
    ids = tokenizer.encode("one two three four")
    streams.open("a", "gw-1", 3, [], True)
    first = streams.step(batch(TokenDelta(rid="a", token_ids=ids[:2], pos=0)))
    assert first.per_gateway["gw-1"][0].pos == 0
    assert streams.step(batch(TokenDelta(rid="a", token_ids=ids[:2], pos=0))).per_gateway == {}  # a repeat
    gap = streams.step(batch(TokenDelta(rid="a", token_ids=ids[3:], pos=3)))  # token 2 never came
    (delta,) = gap.per_gateway["gw-1"]
    assert (delta.finish_reason, delta.error.code, delta.error.status) == ("error", "stream_gap", 503)
    assert gap.aborts == {"a": "error"} and "a" not in streams


def test_a_resumed_stream_expects_the_position_after_its_replayed_output(streams, tokenizer):
    ids = tokenizer.encode("one two three")
    streams.open("a", "gw-1", 3, [], True, output_ids=ids[:2], emitted_chars=len("one two"))
    out = streams.step(batch(TokenDelta(rid="a", token_ids=ids[2:], pos=2, finish_reason="length")))
    (delta,) = out.per_gateway["gw-1"]
    assert (delta.text, delta.finish_reason) == (" three", "length")
