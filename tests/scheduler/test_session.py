"""Resumed submissions: the replayed output counts as output, and the request
continues exactly as an undisturbed one would."""

from __future__ import annotations

import pytest

from libs.protocol import ServiceError
from libs.protocol.messages import SamplingParams, SubmitRequest
from services.scheduler.request import Req
from services.scheduler.session import _split_resumed

from .test_batcher import drain, make


def submit(ids, n, max_new=8) -> SubmitRequest:
    return SubmitRequest(rid="r", input_ids=ids, sampling=SamplingParams(max_new_tokens=max_new),
                         detok_instance="tok1", num_output_tokens=n)


def test_split_resumed():
    assert _split_resumed(submit([5, 6, 7], 0), 1000) == ([5, 6, 7], [])
    assert _split_resumed(submit([5, 6, 7, 8], 2), 1000) == ([5, 6], [7, 8])
    for bad in (submit([5, 6], 2), submit([5, 6], -1), submit([5, 6, 7], 2, max_new=2),
                submit([5, 6, 1000], 1)):
        with pytest.raises(ServiceError) as err:
            _split_resumed(bad, 1000)
        assert err.value.status == 400


@pytest.mark.parametrize("cached", [False, True])
def test_a_resumed_request_continues_like_an_undisturbed_one(cached):
    prompt = list(range(10, 30))
    b, w = make(page_size=4)
    b.submit(Req(rid="a", input_ids=prompt, sampling=SamplingParams(max_new_tokens=12),
                 detok_instance="tok1"))
    full = drain(b, w)["a"]
    assert len(full) == 12
    if not cached:  # a worker that never saw the prompt
        b, w = make(page_size=4)
    for k in (1, 5, 11):
        p, out = _split_resumed(submit(prompt + full[:k], k, max_new=12), 1000)
        b.submit(Req(rid=f"r{k}", input_ids=p, sampling=SamplingParams(max_new_tokens=12),
                     detok_instance="tok1", output_ids=out))
        deltas = []
        while b.has_work():
            batch = b.next_batch()
            if batch is not None:
                b.complete(w.run(batch))
            deltas += [d for _, d in b.take_deltas()]
        assert [t for d in deltas for t in d.token_ids] == full[k:]
        last = deltas[-1]
        assert last.finish_reason == "length"
        assert (last.prompt_tokens, last.completion_tokens) == (len(prompt), 12)
