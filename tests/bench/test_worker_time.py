"""The workers' idle fraction from two /metrics scrapes."""

from __future__ import annotations

import math

from radixmesh.bench.worker_time import idle_fraction, parse

PAGE = """# HELP radixmesh:worker_busy_seconds Seconds of model forward time
# TYPE radixmesh:worker_busy_seconds gauge
radixmesh:worker_busy_seconds{model_name="m",worker="w0"} 3.0
radixmesh:worker_busy_seconds{model_name="m",worker="w1"} 1.5
radixmesh:worker_active_seconds{model_name="m",worker="w0"} 4.0
radixmesh:worker_active_seconds{model_name="m",worker="w1"} 2.0
radixmesh:worker_idle_fraction{model_name="m",worker="w0"} 0.25
"""


def test_parse_sums_the_workers():
    assert parse(PAGE) == (4.5, 6.0)
    assert parse("sglang:num_running_reqs 0.0\n") is None


def test_idle_fraction_over_the_run_only():
    before, after = (4.5, 6.0), (13.5, 16.0)  # 9 s busy of 10 s active
    assert math.isclose(idle_fraction(before, after), 0.1)
    assert math.isnan(idle_fraction(None, after))
    assert math.isnan(idle_fraction(before, before))  # no active time: unknown
