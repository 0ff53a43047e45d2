"""A store whose server stalls or goes away mid-run: every call ends within its timeout
with StoreUnavailable, never a hang; a stall that ends leaves the store working."""

from __future__ import annotations

import os
import signal
import time

import nats
import pytest
import torch

from libs.transfer import HostKVPool, KVLayout, PageSpec, StoreUnavailable, page_keys, page_values
from libs.transfer.jetstream_store import JetStreamStore

from .conftest import filled_pool
from .jetstream import JetStreamServer

P = 16
TIMEOUT = 0.5


async def _calls(store: JetStreamStore, keys: list[str], values: list[bytes]) -> None:
    """Each call of the interface: ends with StoreUnavailable within the timeout."""
    for call in (lambda: store.batch_exists(keys), lambda: store.batch_get(keys),
                 lambda: store.batch_set(list(zip(keys, values)))):
        start = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await call()
        assert time.monotonic() - start < TIMEOUT + 1.0


async def test_stalled_then_stopped_server_ends_calls_with_a_typed_error():
    pool = filled_pool()
    spec = PageSpec(KVLayout.of_pool(pool), P)
    host = HostKVPool.for_pool(pool, 2 * P)
    host.save(pool, torch.arange(2 * P), torch.arange(2 * P))
    values = page_values(spec, host.read(torch.arange(2 * P)))
    keys = page_keys("m", "float32", list(range(2 * P)), "", P)
    with JetStreamServer() as server:
        nc = await nats.connect(server.url, reconnect_time_wait=0.2, max_reconnect_attempts=-1)
        try:
            store = await JetStreamStore.open(nc, spec, bucket="down", max_bytes=1 << 20, timeout_s=TIMEOUT)
            assert await store.batch_set(list(zip(keys, values))) == 2
            os.kill(server.proc.pid, signal.SIGSTOP)  # slow: connected, but nothing answers
            try:
                await _calls(store, keys, values)
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            assert await store.batch_get(keys) == values
            server.stop()  # gone
            await _calls(store, keys, values)
            assert store.stats.errors == 6
        finally:
            await nc.close()


async def test_a_broker_without_jetstream_is_named_at_open(nats_server):
    nc = await nats.connect(nats_server.url)
    try:
        start = time.monotonic()
        with pytest.raises(StoreUnavailable, match="nats-server -js"):
            await JetStreamStore.open(nc, PageSpec(KVLayout(2, 1, 4, "float32"), P), timeout_s=TIMEOUT)
        assert time.monotonic() - start < TIMEOUT + 1.0
    finally:
        await nc.close()
