"""What a worker's scheduler publishes besides tokens: KV events numbered per
epoch, snapshots of the cache, measured step rates and load reports."""

from __future__ import annotations

import secrets
import time

from libs.protocol.messages import KVEvent, KVEventBatch, KVSnapshot

from .radix_cache import RadixCache


class EventLog:
    """Collects the tree's stored / removed / cleared events until they are taken."""

    def __init__(self, worker_id: str, page_size: int) -> None:
        self.worker_id = worker_id
        self.page_size = page_size
        self.epoch = secrets.randbits(62)
        self.seq = 0  # number of the first event not yet taken
        self._events: list[KVEvent] = []

    def record(self, kind: str, namespace: str, hashes: list[int], medium: str = "device") -> None:
        self._events.append(KVEvent(kind=kind, namespace=namespace, block_hashes=hashes,
                                    medium=medium))

    def new_epoch(self) -> None:
        """The cache was flushed: the index must start over."""
        self.epoch, self.seq = secrets.randbits(62), 0

    def take(self) -> KVEventBatch | None:
        if not self._events:
            return None
        events, self._events = self._events, []
        batch = KVEventBatch(worker_id=self.worker_id, epoch=self.epoch, seq=self.seq,
                             page_size=self.page_size, events=events, ts=time.time())
        self.seq += len(events)
        return batch

    def snapshot(self, tree: RadixCache | None) -> KVSnapshot:
        """All cached pages; events not yet taken are already reflected in it."""
        return KVSnapshot(worker_id=self.worker_id, epoch=self.epoch,
                          seq=self.seq + len(self._events), page_size=self.page_size,
                          block_hashes=tree.all_hashes() if tree else [],
                          host_hashes=tree.host_hashes() if tree else [])


class DecodeFit:
    """A decode step's seconds against its rows, ``seconds = base + row_s x rows``, fitted
    by exponentially weighted least squares over decode-only steps. ``row_s`` (what one
    more decoding row costs each step: the router's decode load) keeps its last estimate
    while the batch size varies too little to tell; 0 until it first could."""

    DECAY = 0.98  # per step: ~50 steps of memory
    MIN_STEPS = 8.0  # (weighted) steps before a first estimate
    MIN_VARIANCE = 0.25  # of the rows in the window (a spread of about one row)

    def __init__(self) -> None:
        self.n = self.x = self.y = self.xx = self.xy = 0.0
        self.row_s = 0.0

    def add(self, rows: int, seconds: float) -> None:
        d = self.DECAY
        self.n, self.x, self.y = d * self.n + 1, d * self.x + rows, d * self.y + seconds
        self.xx, self.xy = d * self.xx + rows * rows, d * self.xy + rows * seconds
        mean_x = self.x / self.n
        variance = self.xx / self.n - mean_x * mean_x
        if self.n >= self.MIN_STEPS and variance >= self.MIN_VARIANCE:
            covariance = self.xy / self.n - mean_x * self.y / self.n
            self.row_s = max(covariance / variance, 0.0)


class StepRates:
    """Measured prefill tokens/s, decode step time (and its growth per row) and host-tier
    copy rate (EMAs), from step results."""

    def __init__(self) -> None:
        self.prefill_tps = 0.0  # over steps dominated by prefill
        self.decode_step_s = 0.0  # over decode-only steps
        self.decode = DecodeFit()  # decode-only steps: seconds against rows
        self.host_load_tps = 0.0  # tokens of KV copied to or from the host tier per second

    @property
    def decode_row_s(self) -> float:
        return self.decode.row_s

    def copied(self, tokens: int, seconds: float) -> None:
        if tokens >= 16 and seconds > 0:
            rate = tokens / seconds
            self.host_load_tps = rate if not self.host_load_tps else 0.8 * self.host_load_tps + 0.2 * rate

    def measure(self, extend_lens: list[int], seconds: float) -> None:
        prefill = sum(n for n in extend_lens if n > 1)
        if prefill >= 64:
            rate = prefill / max(seconds, 1e-6)
            self.prefill_tps = rate if not self.prefill_tps else 0.8 * self.prefill_tps + 0.2 * rate
        elif not prefill and extend_lens:
            self.measure_decodes(len(extend_lens), seconds)

    def measure_decodes(self, rows: int, seconds: float) -> None:
        """A decode-only step of ``rows`` requests took ``seconds``."""
        self.decode_step_s = (seconds if not self.decode_step_s
                              else 0.8 * self.decode_step_s + 0.2 * seconds)
        self.decode.add(rows, seconds)

