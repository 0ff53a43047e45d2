"""The decode benchmark's stack measurement on the session's real stack: tokens/s, the
worker's idle share from the scheduler's books, the CPU of everything else."""

from __future__ import annotations

import asyncio
import json
import math
import os

import pytest

from radixmesh.benchmarks.decode import make_prompts, measure_stack, run_sizes


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux /proc only")
def test_measure_stack_reads_the_idle_share_and_the_other_processes_cpu(stack):
    pids = stack.pids()
    assert {"gateway", "scheduler", "tokenizer", "cache_index", "gpu_worker-0", "nats-server"} <= set(pids)
    run = asyncio.run(measure_stack(stack.url, pids, make_prompts(2, 32), 6))
    assert run.tokens_per_s > 0
    assert 0.0 <= run.idle < 1.0  # NOTE: NaN (no books read) fails here too
    assert run.client > 0  # this process read the streams
    assert not math.isnan(run.others) and run.others > 0  # the gateway, tokenizer, scheduler, broker


def test_the_benchmark_refuses_a_stack_that_runs_other_linears_than_its_runner(stack, model_dir, tmp_path):
    """The stack fixture asks for float32: a float32 runner matches its worker's start-up line; the
    same line naming another kernel (what an auto runner on an AVX2 CPU would be) is refused."""
    from radixmesh.benchmarks.decode import check_same_setup
    from services.gpu_worker.model_runner import ModelRunner, RunnerConfig

    runner = ModelRunner(RunnerConfig(model=str(model_dir), kv_slots=64, max_requests=2, dtype="float32"))
    log = stack.config.log_dir / "gpu_worker-0.log"
    check_same_setup(runner, log)
    kernel = runner.model.linear_kernel
    other = tmp_path / "worker.log"
    other.write_text(log.read_text().replace(f", {kernel} linears,", ", some-other linears,"))
    with pytest.raises(RuntimeError, match="does not run what the runner runs"):
        check_same_setup(runner, other)


def test_a_batch_64_run_gets_the_kv_and_the_one_step_prefill_it_needs():
    """At batch 64 x 256 the prompts (16,384 tokens) overflow the default chunk (1,024) and the
    old 16,384 slots: the stacks would prefill over many steps and count early decodes in a
    window that starts at the last first token."""
    slots, flags = run_sizes([1, 8, 64], 256, 128)
    assert slots >= 64 * (256 + 128) * 1.25  # whole pages and the admission's headroom
    assert flags[0] == "--chunked-prefill-size" and int(flags[1]) >= 64 * 256
    assert run_sizes([1], 256, 128)[0] == 16384  # small runs keep the old pool


def test_the_window_counts_only_the_tokens_that_arrived_inside_it():
    """A request that decoded before the window opened adds only what it received inside it."""
    from radixmesh.benchmarks.decode import _tokens_by
    from radixmesh.benchmarks.sse_client import StreamTimes

    def event(n: int) -> bytes:
        return json.dumps({"meta_info": {"completion_tokens": n}}).encode()

    early = StreamTimes(1.0, [(1.0, event(1)), (2.0, event(2)), (3.0, event(4)), (5.0, event(5))])
    assert _tokens_by(early, 0.5) == 0 and _tokens_by(early, 2.5) == 2 and _tokens_by(early, 9.0) == 5
    assert _tokens_by(early, 9.0) - _tokens_by(early, 3.0) == 1  # the window [3, 9]: one token
