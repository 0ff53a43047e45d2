"""Which pages the shared store (L3) holds, as the index learns it from a watch on the
JetStream bucket's keys (headers only: no page bytes move to the index).

Keys are ``<model>.<kv dtype>.<page hash, 16 hex>`` (libs.transfer.page_key). The bucket
drops its oldest pages when full without a delete marker, so this view can hold pages
already gone: a page credited here and missing at fetch time costs that request one
store miss (it is recomputed), never a wrong answer. The view is bounded (oldest first).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

log = logging.getLogger("cache_index.store")

MASK = (1 << 64) - 1
MAX_PAGES = 1 << 20
RETRY_S = 2.0


class StorePages:
    def __init__(self, max_pages: int = MAX_PAGES) -> None:
        self.max_pages = max_pages
        self._pages: OrderedDict[tuple[str, str, int], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pages)

    def add_key(self, key: str) -> bool:
        parts = key.split(".")
        if len(parts) != 3:
            return False
        try:
            page = (parts[0], parts[1], int(parts[2], 16))
        except ValueError:
            return False
        self._pages[page] = None
        self._pages.move_to_end(page)
        while len(self._pages) > self.max_pages:
            self._pages.popitem(last=False)
        return True

    def discard_key(self, key: str) -> None:
        parts = key.split(".")
        if len(parts) == 3:
            try:
                self._pages.pop((parts[0], parts[1], int(parts[2], 16)), None)
            except ValueError:
                pass

    def leading(self, prefix: str, hashes: list[int]) -> int:
        """How many of ``hashes`` (consecutive pages) the store holds under ``prefix``
        (LoadReport.store_prefix: "<model>.<kv dtype>"), from the first."""
        parts = prefix.split(".")
        if len(parts) != 2:
            return 0
        n = 0
        for h in hashes:
            if (parts[0], parts[1], h & MASK) not in self._pages:
                break
            n += 1
        return n


async def watch_bucket(nc, bucket: str, pages: StorePages) -> None:
    """Follow the bucket's keys until cancelled; waits for the bucket to exist (the first
    worker with ``--kv-store nats`` creates it) and re-watches after a failure."""
    js = nc.jetstream()
    while True:
        try:
            kv = await js.key_value(bucket)
            watcher = await kv.watchall(headers_only=True)
            log.info("watching the shared store's bucket %s", bucket)
            async for entry in watcher:
                if entry is None:
                    continue
                if entry.operation in ("DEL", "PURGE"):
                    pages.discard_key(entry.key)
                else:
                    pages.add_key(entry.key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - no bucket yet, or the broker is away: retry
            log.debug("store watch on %s: %s", bucket, exc)
        await asyncio.sleep(RETRY_S)
