"""n choices: seeds, usage, and the order in which choices are submitted."""

from __future__ import annotations

import asyncio

import pytest

from libs.protocol import errors, tracing
from libs.protocol.messages import Usage
from services.gateway.choices import choice_requests, open_choices
from services.gateway.formats import choices_usage
from services.gateway.request import GenerationRequest
from services.gateway.sampling import unresolved


def test_choice_i_samples_with_seed_plus_i_wrapping_in_int64():
    assert [r.params.seed for r in choice_requests(GenerationRequest(text="a", params=unresolved(seed=5)), 3)] == [5, 6, 7]
    top = (1 << 63) - 1
    assert [r.params.seed for r in choice_requests(GenerationRequest(text="a", params=unresolved(seed=top)), 2)] == [top, -(1 << 63)]
    assert [r.params.seed for r in choice_requests(GenerationRequest(text="a"), 2)] == [None, None]
    one = GenerationRequest(text="a", params=unresolved(seed=1))
    assert choice_requests(one, 1) == [one]


def test_usage_counts_each_prompt_once():
    usages = [Usage(prompt_tokens=10, completion_tokens=c, cached_tokens=k)
              for c, k in ((3, 0), (4, 10), (5, 2), (6, 10))]
    assert choices_usage(usages, 2) == Usage(prompt_tokens=20, completion_tokens=18, cached_tokens=2)
    assert choices_usage(usages[:1]) == usages[0]


class _Gen:
    def __init__(self, rid: str) -> None:
        self.rid, self.closed = rid, False

    def close(self) -> None:
        self.closed = True


async def test_each_prompts_first_choice_is_submitted_before_its_others():
    events: list[str] = []

    async def submit(req):
        rid = tracing.request_id.get()
        events.append(f"start {rid}")
        await asyncio.sleep(0.01)
        events.append(f"done {rid}")
        return _Gen(rid)

    reqs = [GenerationRequest(text=t) for t in "aaabbb"]
    gens = await open_choices(submit, reqs, 3, "base")
    assert [g.rid for g in gens] == [f"base/{i}" for i in range(6)]
    for first, others in (("base/0", ("base/1", "base/2")), ("base/3", ("base/4", "base/5"))):
        for other in others:
            assert events.index(f"done {first}") < events.index(f"start {other}")
    assert events.index("start base/3") < events.index("done base/0")  # prompts run side by side


async def test_a_failed_choice_closes_those_opened():
    opened: list[_Gen] = []

    async def submit(req):
        if tracing.request_id.get() == "r/2":
            raise errors.overloaded("busy")
        opened.append(_Gen(tracing.request_id.get()))
        return opened[-1]

    with pytest.raises(Exception, match="busy"):
        await open_choices(submit, [GenerationRequest(text="a")] * 3, 3, "r")
    assert opened and all(g.closed for g in opened)


async def test_native_n_is_bounded_and_not_streamed():
    from .test_routes import RecordingBackend, _error, make_client

    backend = RecordingBackend()
    async with make_client(backend) as client:
        _error(await client.post("/generate", json={"text": "a", "sampling_params": {"n": 17}}), 400,
               "sampling_params.n", "<= 16")
        _error(await client.post("/generate", json={"text": "a", "stream": True, "sampling_params": {"n": 2}}),
               400, "sampling_params.n", "not supported")
        await client.post("/generate", json={"text": "a", "sampling_params": {"n": 3, "seed": 9}})
    assert [r.params.seed for r in backend.requests] == [9]  # the first choice, refused: the rest never sent
