"""The scheduler process's own Prometheus metrics (served with --metrics-port)."""

from __future__ import annotations

from prometheus_client import Histogram

QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# submit -> first admitted to a step: on a colocated ("both") or prefill worker the wait for
# a place in a step; on a decode worker the wait for room, the prefill worker and the KV
QUEUE_SECONDS = Histogram("radixmesh:queue_seconds",
                          "Seconds from a request's arrival at its scheduler to its first step, by the "
                          "worker's role", ["role"], buckets=QUEUE_BUCKETS)
