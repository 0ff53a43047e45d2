"""The compute thread keeps its torch thread count; the thread that built it runs on one."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from services.gpu_worker.compute import ComputeThread, side_thread


@pytest.fixture
def main_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _count_after_parallel_work() -> int:
    torch.ones(1 << 20).sum()  # NOTE: parallel work reads the count first on a fresh thread
    return torch.get_num_threads()


def test_counts_are_per_thread_and_stay(main_threads):
    compute = ComputeThread(2)
    try:
        assert torch.get_num_threads() == 1
        torch.set_num_threads(3)  # set elsewhere later: torch's shared count moves, ours does not
        assert compute.call(_count_after_parallel_work) == 2
        assert compute.call(threading.current_thread).name.startswith("compute")
    finally:
        compute.shutdown()


def test_the_caller_can_keep_its_count(main_threads):
    torch.set_num_threads(2)
    compute = ComputeThread(1, release_caller=False)
    try:
        assert torch.get_num_threads() == 2 and compute.call(_count_after_parallel_work) == 1
    finally:
        compute.shutdown()


async def test_work_runs_in_order_with_the_callers_context(main_threads):
    import contextvars

    var = contextvars.ContextVar("var", default="unset")
    var.set("caller")
    compute, seen = ComputeThread(1, release_caller=False), []
    try:
        await asyncio.gather(*(compute.run(lambda i=i: seen.append((i, var.get()))) for i in range(20)))
        assert seen == [(i, "caller") for i in range(20)]
        with pytest.raises(ValueError):
            ComputeThread(0)
    finally:
        compute.shutdown()


async def test_side_threads_run_torch_on_one_thread(main_threads):
    compute = ComputeThread(2)
    try:
        assert await side_thread(_count_after_parallel_work) == 1
        assert await side_thread(lambda a, b: a + b, 2, 3) == 5
        assert compute.call(_count_after_parallel_work) == 2  # the compute thread keeps its team
    finally:
        compute.shutdown()
