"""The in-process scheduler-core benchmark measures real steady decode steps."""

from __future__ import annotations

from radixmesh.benchmarks import sched_core


def test_it_times_every_part_of_a_steady_decode_step():
    times = sched_core.measure(batch=16, steps=24)
    assert times.plan > 0 and times.apply > 0 and times.codec > 0
    assert times.total == times.plan + times.apply + times.codec
    assert times.total < 50  # ms per step at batch 16: far above any real cost, below a hang


def test_the_table_has_a_row_per_batch(capsys):
    sched_core.main(["--batches", "4", "8", "--steps", "8", "--rounds", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[0] for row in rows] == ["| 4", "| 8"]
