"""Limits and timeouts that several services must agree on, defined once."""

from __future__ import annotations

# top logprobs per position: the gateway validates it, the scheduler refuses more at submit,
# the worker computes at most this many
MAX_TOP_LOGPROBS = 20

# a worker unheard from this long is gone: the scheduler drops a worker whose announces stop,
# the cache index and the gateway's own load view stop routing to one whose load reports stop
# (workers announce every 1 s, schedulers report load every 0.5 s)
WORKER_LIVENESS_S = 3.0

# the shared KV store's JetStream bucket: workers put and fetch pages there, the cache
# index watches its keys (libs.transfer.jetstream_store)
KV_STORE_BUCKET = "radixmesh-kv"
