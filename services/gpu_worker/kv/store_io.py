"""The worker's side of the shared KV store: puts staged at step time and uploaded in the
background, fetches downloaded into host slots. The scheduler decides; this moves bytes.

    put    KVCopy("put", src=host slots, keys): the step copies the slots (so a later
           step's d2h into them cannot change what is uploaded); the upload runs on the
           event loop, off the step's path (bounded bytes queued; a put over the bound, or
           one the store fails, is counted and logged, never fails a step)
    fetch  FetchPages(keys, host_slots, deadline_s) -> FetchReply: pages written into the
           host slots as they arrive; at the end or the deadline, the leading intact ones
           count, and nothing is written after the reply; one fetch at a time, first come
           first served (the deadline counts the wait)
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
from prometheus_client import Counter

from libs.protocol.messages import FetchReply
from libs.transfer import HostKVPool, KVBuffer, PageStore, StoreError, TransferError, page_values

log = logging.getLogger("gpu_worker.store")

DEFAULT_QUEUE_BYTES = 512 << 20

STORE_BYTES = Counter("radixmesh:kv_store_bytes", "Bytes moved to and from the shared KV store", ["op"])
STORE_PAGES = Counter("radixmesh:kv_store_pages", "Pages put to / fetched from the shared KV store, by outcome",
                      ["op", "outcome"])


@dataclass
class PutStats:
    staged: int = 0  # pages copied at step time
    stored: int = 0
    failed: int = 0  # the store refused or was unavailable
    dropped: int = 0  # over the queue's byte bound


class StoreIO:
    """Puts and fetches between ``host`` (the worker's host pool) and ``store``.
    ``start`` (on the event loop) before steps stage puts; ``stop`` ends the uploader."""

    def __init__(self, store: PageStore, host: HostKVPool, max_queued_bytes: int = DEFAULT_QUEUE_BYTES) -> None:
        self.store = store
        self.host = host
        self.page_tokens = store.spec.page_tokens
        self.max_queued_bytes = max_queued_bytes
        self.puts = PutStats()
        self._queued = 0  # bytes staged, not yet uploaded
        self._lock = threading.Lock()
        self._queue: asyncio.Queue[tuple[list[str], torch.Tensor]] = asyncio.Queue()
        self._fetching = asyncio.Lock()  # fair: fetches are served first come, first served
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._upload_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def drain(self) -> None:
        """Wait until every staged put was uploaded (or failed)."""
        await self._idle.wait()

    # -- put: stage in the step thread, upload on the loop
    def stage_put(self, keys: list[str], host_slots: torch.Tensor) -> None:
        """Copy ``host_slots`` now and queue their upload under ``keys`` (thread-safe)."""
        nbytes = len(host_slots) * self.host.layout.token_bytes
        with self._lock:
            if self._queued + nbytes > self.max_queued_bytes:
                self.puts.dropped += len(keys)
                STORE_PAGES.labels("put", "dropped").inc(len(keys))
                log.warning("store put of %d pages dropped: %d bytes already queued", len(keys), self._queued)
                return
            self._queued += nbytes
            self.puts.staged += len(keys)
        rows = self.host.read(host_slots)
        self._loop.call_soon_threadsafe(self._enqueue, keys, rows)

    def _enqueue(self, keys: list[str], rows: torch.Tensor) -> None:
        self._idle.clear()
        self._queue.put_nowait((keys, rows))

    async def _upload_loop(self) -> None:
        while True:
            keys, rows = await self._queue.get()
            try:
                await self._upload(keys, rows)
            finally:
                with self._lock:
                    self._queued -= rows.numel() * rows.element_size()
                if self._queue.empty():
                    self._idle.set()

    async def _upload(self, keys: list[str], rows: torch.Tensor) -> None:
        try:
            values = await asyncio.to_thread(page_values, self.store.spec, rows)  # CRC-32 off the loop
            stored = await self.store.batch_set(list(zip(keys, values)))
        except (StoreError, TransferError) as exc:
            stored = 0
            log.warning("store put of %d pages failed: %s", len(keys), exc)
        self.puts.stored += stored
        self.puts.failed += len(keys) - stored
        STORE_PAGES.labels("put", "stored").inc(stored)
        STORE_PAGES.labels("put", "failed").inc(len(keys) - stored)
        STORE_BYTES.labels("put").inc(stored * self.store.spec.value_bytes)

    # -- fetch
    async def fetch(self, keys: list[str], host_slots: np.ndarray, deadline_s: float) -> FetchReply:
        """Download ``keys`` into ``host_slots`` (``page_tokens`` each, checked by the caller)
        until done or ``deadline_s``; the reply counts the leading pages that arrived intact."""
        start = 0.0
        slots = torch.from_numpy(np.asarray(host_slots, dtype=np.int64)).view(len(keys), self.page_tokens)
        written = np.zeros(len(keys), dtype=bool)
        tally = {"bad": 0, "missing": 0, "bytes": 0}

        async def on_page(i: int, page: KVBuffer | None, bad: bool) -> None:
            if page is None:
                tally["bad" if bad else "missing"] += 1
                return
            self.host.write(slots[i], page)  # NOTE: on the loop: no write can follow the reply
            written[i] = True
            tally["bytes"] += page.nbytes

        deadline, error = False, ""
        try:
            async with asyncio.timeout(deadline_s):
                async with self._fetching:  # NOTE: one fetch at a time, in arrival order (the scheduler predicts so)
                    start = time.perf_counter()  # NOTE: the reply's seconds: the transfer, not the wait
                    await self.store.get_each(keys, on_page)
        except TimeoutError:
            deadline = True
        except StoreError as exc:
            error = str(exc) or type(exc).__name__
        arrived = len(keys) if written.all() else int(np.argmin(written))
        return self._reply(arrived, tally, time.perf_counter() - start if start else 0.0, deadline, error)

    def _reply(self, arrived: int, tally: dict, seconds: float, deadline: bool, error: str) -> FetchReply:
        STORE_PAGES.labels("fetch", "arrived").inc(arrived)
        STORE_PAGES.labels("fetch", "bad").inc(tally["bad"])
        STORE_BYTES.labels("fetch").inc(tally["bytes"])
        if deadline or error:
            STORE_PAGES.labels("fetch", "deadline" if deadline else "unavailable").inc()
        return FetchReply(arrived=arrived, missing=tally["missing"], bad=tally["bad"], seconds=seconds,
                          nbytes=tally["bytes"], deadline=deadline, error=error)
