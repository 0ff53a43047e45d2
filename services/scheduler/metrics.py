"""The scheduler process's own Prometheus metrics (served with --metrics-port)."""

from __future__ import annotations

from prometheus_client import Gauge, Histogram

QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# submit -> first admitted to a step: on a colocated ("both") or prefill worker the wait for
# a place in a step; on a decode worker the wait for room, the prefill worker and the KV
QUEUE_SECONDS = Histogram("radixmesh:queue_seconds",
                          "Seconds from a request's arrival at its scheduler to its first step, by the "
                          "worker's role", ["role"], buckets=QUEUE_BUCKETS)

# NOTE: one series per worker, from the one scheduler that drives it (not re-exported by every
# gateway): what an HPA or KEDA scales workers on (deploy/k8s)
_LABELS = ["worker", "role", "model_name"]
WORKER_WAITING = Gauge("radixmesh:worker_waiting_requests",
                       "Requests queued for a worker, not yet in its running batch", _LABELS)
WORKER_RUNNING = Gauge("radixmesh:worker_running_requests", "Requests in a worker's running batch", _LABELS)


def report_worker(worker: str, role: str, model: str, waiting: int, running: int) -> None:
    WORKER_WAITING.labels(worker, role, model).set(waiting)
    WORKER_RUNNING.labels(worker, role, model).set(running)


def forget_worker(worker: str, role: str, model: str) -> None:
    """A worker this scheduler no longer drives: its series go (another scheduler's take over)."""
    for gauge in (WORKER_WAITING, WORKER_RUNNING):
        try:
            gauge.remove(worker, role, model)
        except KeyError:
            pass
