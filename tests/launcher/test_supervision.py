"""The launcher's supervision without the model: restart policy, crash loops, logs."""

from __future__ import annotations

import threading

import pytest

from radixmesh.launcher import LocalStack, RestartPolicy, StackError, StackStopped, ephemeral_stack_config

pytestmark = pytest.mark.slow  # starts real service processes


def test_backoff_doubles_up_to_its_cap():
    policy = RestartPolicy(backoff_s=0.25, max_backoff_s=2.0)
    assert [policy.delay(n) for n in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]


def test_a_crash_loop_ends_the_stack_with_this_runs_log_tail(tmp_path):
    (tmp_path / "cache_index.log").write_text("A LINE OF AN EARLIER RUN\n")
    config = ephemeral_stack_config(
        tmp_path, workers=0, extra={"cache_index": ["--no-such-flag"]},
        restart=RestartPolicy(max_restarts=2, window_s=60, backoff_s=0.05))
    lines: list[str] = []
    stack = LocalStack(config, progress=lines.append)
    with pytest.raises(StackError) as err:
        stack.start(timeout=120)
    message = str(err.value)
    assert "cache_index exited with code 2 after 2 restarts within 60s (a crash loop)" in message
    assert "unrecognized arguments: --no-such-flag" in message
    assert "EARLIER RUN" not in message  # the log was emptied when the stack started
    restarts = [line for line in lines if line.startswith("radixmesh: cache_index exited with code 2")]
    assert len(restarts) == 2 and "restart 2 of 2 allowed per 60s" in restarts[1], lines
    log = (tmp_path / "cache_index.log").read_text()
    assert log.count("--- radixmesh: restarted at") == 2 and log.count("--no-such-flag") == 3
    assert not (tmp_path / "stack.json").exists() and stack.procs == []


def test_a_stop_asked_for_while_starting_ends_the_start_and_restarts_nothing(tmp_path):
    config = ephemeral_stack_config(tmp_path, workers=0)  # never healthy: start() waits
    stack = LocalStack(config, progress=lambda m: None)
    stopper = threading.Timer(3.0, stack.request_stop)  # what radixmesh up's SIGINT handler does
    stopper.start()
    with pytest.raises(StackStopped):
        stack.start(timeout=120)
    stopper.join()
    assert stack.procs == [] and stack.nats is None
    assert not (tmp_path / "stack.json").exists()
    assert "restarted" not in (tmp_path / "scheduler.log").read_text()
