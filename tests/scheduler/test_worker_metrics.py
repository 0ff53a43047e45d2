"""The per-worker queue gauges an autoscaler reads: set per report, gone with the worker."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.scheduler import metrics


def _value(name: str, worker: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"worker": worker, "role": "both", "model_name": "m"})


def test_a_report_sets_the_workers_gauges_and_forgetting_removes_them():
    metrics.report_worker("wq", "both", "m", waiting=7, running=3)
    assert _value("radixmesh:worker_waiting_requests", "wq") == 7.0
    assert _value("radixmesh:worker_running_requests", "wq") == 3.0
    metrics.forget_worker("wq", "both", "m")
    assert _value("radixmesh:worker_waiting_requests", "wq") is None
    metrics.forget_worker("wq", "both", "m")  # twice is fine
