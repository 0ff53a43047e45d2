import asyncio
import math
import time

import pytest

from radixmesh.bench.runner import Load, arrival_times, run_workload
from radixmesh.bench.workload import Answer, Message, RequestSpec, Workload


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate():
    a = arrival_times(2000, rate=4.0, seed=1)
    assert a == arrival_times(2000, rate=4.0, seed=1) != arrival_times(2000, rate=4.0, seed=2)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    assert 2000 / a[-1] == pytest.approx(4.0, rel=0.1)
    assert arrival_times(3, math.inf, 0) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrival_times(3, 0.0, 0)


def _workload() -> Workload:
    ask = Message.text("user", "q")
    return Workload("t", [
        RequestSpec("a", "turn", (ask,), 4),
        RequestSpec("b", "turn", (ask,), 4),
        RequestSpec("a2", "turn", (ask, Message("assistant", (Answer("a"),)), ask), 4),
        RequestSpec("ab", "combine", (Message("user", (Answer("a"), "+", Answer("b"))),), 4),
    ])


async def test_children_wait_for_parents_and_embed_their_answers():
    finished: dict[str, float] = {}
    started: dict[str, float] = {}
    seen: dict[str, list] = {}

    async def send(spec, messages, record, index):
        started[spec.id] = time.perf_counter()
        seen[spec.id] = messages
        await asyncio.sleep(0.05 if spec.id == "a" else 0.01)
        record.text = f"<{spec.id}>"
        finished[spec.id] = time.perf_counter()

    records, duration = await run_workload(_workload(), "sys", send, Load())
    assert [r.id for r in records] == ["a", "b", "a2", "ab"]
    assert started["a2"] >= finished["a"] and started["ab"] >= max(finished["a"], finished["b"])
    assert seen["a2"][1] == {"role": "assistant", "content": "<a>"}
    assert seen["ab"][0]["content"] == "<a>+<b>"
    assert records[3].depends_on == ["a", "b"]
    assert duration >= 0.06


async def test_concurrency_limit_and_failed_parents():
    running = peak = 0

    async def send(spec, messages, record, index):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        if spec.id == "a":
            record.error = "HTTP 500: boom"

    records, _ = await run_workload(_workload(), "sys", send, Load(max_concurrency=1))
    assert peak == 1
    by_id = {r.id: r for r in records}
    assert by_id["b"].ok and not by_id["a"].ok
    assert "parent" in by_id["a2"].error and "parent" in by_id["ab"].error


async def test_after_waits_without_embedding_and_fixed_arrivals_are_kept():
    ask = Message.text("user", "q")
    w = Workload("t", [
        RequestSpec("late", "doc", (ask,), 4, arrive_s=0.08),
        RequestSpec("s0", "stream", (ask,), 4, arrive_s=0.0),
        RequestSpec("s1", "stream", (ask,), 4, after=("s0",)),
    ])
    started: dict[str, float] = {}
    t0 = time.perf_counter()

    async def send(spec, messages, record, index):
        started[spec.id] = time.perf_counter() - t0
        await asyncio.sleep(0.03)
        if spec.id == "s0":
            record.error = "HTTP 500: boom"  # a lane goes on after a failed stream
        assert messages == [{"role": "user", "content": "q"}]

    records, _ = await run_workload(w, "sys", send, Load(rate=1e-3, seed=0))
    by_id = {r.id: r for r in records}
    assert by_id["s1"].ok and by_id["s1"].depends_on == []
    assert started["s1"] >= started["s0"] + 0.03
    assert 0.08 <= started["late"] < 0.5  # its own time, not the load's (rate 1e-3/s)


def test_workload_rejects_after_pointing_forward():
    ask = Message.text("user", "q")
    with pytest.raises(ValueError, match="do not come before"):
        Workload("x", [RequestSpec("b", "s", (ask,), 4, after=("a",)),
                       RequestSpec("a", "s", (ask,), 4)])
