"""Constrained requests: checked at submit; their rows carry the automaton's start."""

from __future__ import annotations

import pytest

from libs.protocol import ServiceError

from .test_core import EOS, make, req


def _new_rows(b, w, steps: int):
    rows = []
    for _ in range(steps):
        batch = b.next_batch()
        if batch is None:
            break
        rows += batch.new_rows
        b.complete(w.run(batch))
        b.take_deltas()
    return rows


def test_a_new_row_carries_the_pattern_and_how_it_may_end():
    b, w = make()
    b.submit(req("r", prompt=list(range(10, 30)), max_new=4, regex="[0-9]+", stop_token_ids=[7]))
    b.submit(req("free", prompt=list(range(40, 50)), max_new=4))
    rows = {r.row: r for r in _new_rows(b, w, 1)}
    constrained = [r for r in rows.values() if r.regex]
    assert len(rows) == 2 and len(constrained) == 1
    (row,) = constrained
    assert (row.regex, row.regex_from, row.regex_tokens, row.end_ids) == ("[0-9]+", 20, [], [EOS, 7])


def test_a_retracted_row_resumes_after_its_output():
    b, w = make(retract_interval=3, chunked_prefill_size=8, enable_cache=False)
    b.submit(req("a", prompt=list(range(10, 30)), max_new=12, regex="x+"))
    b.submit(req("b", prompt=list(range(40, 52)), max_new=12, regex="y+"))
    seen = _new_rows(b, w, 40)
    again = [r for r in seen if r.regex_tokens]
    assert b.stats().retractions > 0 and again
    for r in again:  # it starts after prompt + output, whose tokens it replays
        prompt = 20 if r.regex == "x+" else 12
        assert r.regex_from == prompt + len(r.regex_tokens)


@pytest.mark.parametrize("fields, message", [
    (dict(regex="(unclosed"), "regex"),
    (dict(regex="a(?=b)"), "regex"),
    (dict(regex="[0-9]+", ignore_eos=True), "ignore_eos"),
])
def test_bad_constrained_requests_are_400(fields, message):
    b, _ = make()
    with pytest.raises(ServiceError) as err:
        b.submit(req("bad", **fields))
    assert err.value.status == 400 and message in err.value.message
    assert not b.waiting


def test_a_model_without_eos_needs_stop_token_ids():
    b, _ = make()
    b.info.eos_token_ids.clear()
    with pytest.raises(ServiceError) as err:
        b.submit(req("no-end", regex="a+"))
    assert err.value.status == 400 and "stop_token_ids" in err.value.message
    b.submit(req("ok", regex="a+", stop_token_ids=[5]))
