"""The mesh benchmark's arithmetic: processes grouped by service, per step and per token."""

from __future__ import annotations

import argparse

from radixmesh.benchmarks.mesh import Reading
from radixmesh.benchmarks.mesh_table import per_process, per_service, print_tables, service_of


def test_processes_group_by_service():
    assert [service_of(n) for n in ("gateway", "gateway-1", "gpu_worker-0", "cache_index", "nats-server",
                                    "nats-server-n2", "tokenizer-3")] == [
        "gateway", "gateway", "gpu_worker", "cache_index", "nats-server", "nats-server", "tokenizer"]


def _reading(wall, gateway, gateway1, tokens, client=0.5):
    return Reading(wall, {"gateway": gateway, "gateway-1": gateway1, "scheduler": 1.0, "client": client},
                   steps=tokens // 64, tokens=tokens, forward_s=0.25)


def test_a_long_run_less_a_short_run_less_idle_cpu():
    long, short = _reading(10.0, 6.0, 5.0, 64 * 300), _reading(4.0, 2.0, 1.0, 64 * 100)
    idle = Reading(2.0, {"gateway": 0.2, "gateway-1": 0.0, "scheduler": 0.02, "client": 5.0}, 0, 0, 0.0)
    steady = long.minus(short).less_idle(idle)
    assert steady.wall == 6.0 and steady.tokens == 64 * 200
    assert steady.cpu["gateway"] == 4.0 - 0.1 * 6.0  # 0.1 s per s idle over 6 s
    assert steady.cpu["client"] == 0.0  # the client's own CPU is never corrected
    step_ms = per_process([steady], 64, "step")
    assert abs(step_ms["gateway-1"] - 4.0 / 200 * 1e3) < 1e-9  # 200 steps of 64 tokens
    token_us = per_service([steady], 64, "token")
    assert abs(token_us["gateway"] - (3.4 + 4.0) / (64 * 200) * 1e6) < 1e-6
    assert "client" not in token_us


def test_the_tables_print_every_batch_and_the_siblings(capsys):
    args = argparse.Namespace(gateways=2, tokenizers=1, steps=256, short_steps=64,
                              rounds=1, idle=None)
    print_tables({1: [_reading(2.0, 0.2, 0.2, 200)], 64: [_reading(4.0, 2.0, 2.2, 64 * 200)]}, args)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 1 ") or line.startswith("| 64 ")]
    assert len(rows) == 2
    assert "gateway: gateway" in out and "spread 10%" in out
