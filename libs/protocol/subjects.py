"""Every NATS subject radixmesh uses, built in one place.

All subjects share a prefix (default ``rm``) so several stacks can share one
broker (tests use a random prefix). Instance and worker ids must be single
subject tokens: no dots, spaces or wildcards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"^[A-Za-z0-9_\-]+$")

TOKENIZER_QUEUE = "tokenizer"
# cache-index replicas answer routes, worker lists and snapshots as one queue group;
# KV events, load reports, bookings and releases reach every replica
INDEX_QUEUE = "cache_index"


def check_token(token: str) -> str:
    if not _TOKEN.match(token):
        raise ValueError(f"not a valid subject token: {token!r}")
    return token


@dataclass(frozen=True)
class Subjects:
    prefix: str = "rm"

    def _s(self, *parts: str) -> str:
        return ".".join((self.prefix, *parts))

    # tokenizer: encode is a queue group; detok is per instance (it holds state)
    def tokenizer_encode(self) -> str:
        return self._s("tokenizer", "encode")

    def tokenizer_detok(self, instance: str) -> str:
        return self._s("tokenizer", "detok", check_token(instance))

    # cache index
    def index_route(self) -> str:
        return self._s("index", "route")

    def index_load(self, worker: str) -> str:
        return self._s("index", "load", check_token(worker))

    def index_load_all(self) -> str:
        return self._s("index", "load", "*")

    def index_events(self, worker: str) -> str:
        return self._s("index", "events", check_token(worker))

    def index_events_all(self) -> str:
        return self._s("index", "events", "*")

    def index_release(self) -> str:
        return self._s("index", "release")

    def index_workers(self) -> str:
        return self._s("index", "workers")

    def index_booking(self) -> str:
        return self._s("index", "booking")

    def index_snapshot(self) -> str:
        return self._s("index", "snapshot")

    def index_replica_route(self, instance: str) -> str:
        """Routes answered by this replica only (tests, debugging)."""
        return self._s("index", "replica", check_token(instance), "route")

    # scheduler, one pair of subjects per worker it drives
    def sched_submit(self, worker: str) -> str:
        return self._s("sched", check_token(worker), "submit")

    def sched_abort(self, worker: str) -> str:
        return self._s("sched", check_token(worker), "abort")

    def sched_stats(self, worker: str) -> str:
        return self._s("sched", check_token(worker), "stats")

    def sched_status(self, worker: str) -> str:
        return self._s("sched", check_token(worker), "status")

    def sched_flush(self, worker: str) -> str:
        return self._s("sched", check_token(worker), "flush")

    def sched_snapshot(self, worker: str) -> str:
        return self._s("sched", check_token(worker), "snapshot")

    # prefill/decode: a decode worker's scheduler asks a prefill worker's, which answers
    def sched_prefill(self, worker: str) -> str:
        return self._s("sched", check_token(worker), "prefill")

    def sched_prefill_status(self, worker: str) -> str:
        return self._s("sched", check_token(worker), "prefill_status")

    def sched_kv_ready(self, worker: str) -> str:
        return self._s("sched", check_token(worker), "kv_ready")

    # gpu worker
    def worker_announce(self) -> str:
        return self._s("worker", "announce")

    def worker_adopt(self, worker: str) -> str:
        return self._s("worker", check_token(worker), "adopt")

    def worker_lease(self, worker: str) -> str:
        return self._s("worker", check_token(worker), "lease")

    def worker_forward(self, worker: str) -> str:
        return self._s("worker", check_token(worker), "forward")

    def worker_prepare(self, worker: str) -> str:
        return self._s("worker", check_token(worker), "prepare")

    def worker_fetch(self, worker: str) -> str:
        return self._s("worker", check_token(worker), "fetch")

    # prefill/decode data path: the scheduler asks its worker to send; workers push to workers
    def worker_kv_send(self, worker: str) -> str:
        return self._s("worker", check_token(worker), "kv_send")

    def worker_kv_recv(self, worker: str) -> str:
        return self._s("worker", check_token(worker), "kv_recv")

    def worker_kv_shm(self, worker: str) -> str:
        return self._s("worker", check_token(worker), "kv_shm")

    def worker_kv_land(self, worker: str) -> str:
        return self._s("worker", check_token(worker), "kv_land")

    def worker_kv_drop(self, worker: str) -> str:
        return self._s("worker", check_token(worker), "kv_drop")

    # gateway instance that holds the HTTP connection
    def gateway_out(self, instance: str) -> str:
        return self._s("gw", check_token(instance), "out")

    # health ping, answered by any instance of a service
    def ping(self, service: str) -> str:
        return self._s("ping", check_token(service))
