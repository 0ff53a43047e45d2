"""KV moved between workers in one run: the schedulers' counters at its end.

Each scheduler counts, per worker (``SchedStats``), the transfers its decode side
received whole (their bytes, and the seconds from asking the prefill side to the
KV being ready: the peer's queueing and prefill included), the ones its prefill
side sent, and the failures by reason (the decode side then prefilled itself).
Read after the warm-up and after the run, the difference is the run's.
"""

from __future__ import annotations

import asyncio
import math
import sys
from dataclasses import dataclass, field
from typing import Iterable

from libs.protocol import Bus, Subjects
from libs.protocol.messages import SchedStats, SchedStatsRequest, WorkersReply, WorkersRequest


@dataclass(frozen=True)
class Transfers:
    received: int = 0
    sent: int = 0
    nbytes: int = 0  # received
    seconds: float = 0.0  # summed over the received: asked -> KV ready
    failures: dict[str, int] = field(default_factory=dict)

    @classmethod
    def total(cls, stats: Iterable[SchedStats]) -> "Transfers":
        received = sent = nbytes = 0
        seconds = 0.0
        failures: dict[str, int] = {}
        for st in stats:
            received += st.kv_transfers_in
            sent += st.kv_transfers_out
            nbytes += st.kv_transfer_bytes
            seconds += st.kv_transfer_seconds
            for reason, n in st.kv_transfer_failures.items():
                failures[reason] = failures.get(reason, 0) + n
        return cls(received, sent, nbytes, seconds, failures)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def since(self, before: "Transfers") -> "Transfers":
        """What happened between the reading ``before`` and this one."""
        failures = {k: n - before.failures.get(k, 0) for k, n in self.failures.items()}
        return Transfers(self.received - before.received, self.sent - before.sent,
                         self.nbytes - before.nbytes, self.seconds - before.seconds,
                         {k: n for k, n in failures.items() if n})


async def collect(nats_url: str, subject_prefix: str) -> Transfers:
    """The totals over every worker the stack's cache index knows."""
    subjects = Subjects(subject_prefix)
    bus = await Bus.connect(nats_url, "bench-transfers")
    try:
        reply = await bus.request(subjects.index_workers(), WorkersRequest(), WorkersReply)
        stats = [await bus.request(subjects.sched_stats(w.worker_id), SchedStatsRequest(),
                                   SchedStats) for w in reply.workers]
    finally:
        await bus.close()
    return Transfers.total(stats)


async def read_counters(nats_url: str, subject_prefix: str,
                        timeout_s: float = 30.0) -> Transfers | None:
    """:func:`collect`, or None (said on stderr) when the stack does not answer."""
    try:
        return await asyncio.wait_for(collect(nats_url, subject_prefix), timeout_s)
    except Exception as exc:  # NOTE: the run's records stand without the counters
        print(f"note: KV transfer counters unavailable: {exc!r}", file=sys.stderr)
        return None


def _row(system: str, layout: str, t: Transfers | None) -> str:
    if t is None:
        return f"| {system} | {layout} | - | - | - | - | - |"
    mean_mb = t.nbytes / t.received / 1e6 if t.received else math.nan
    mean_ms = t.seconds / t.received * 1000 if t.received else math.nan
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(t.failures.items()))
    cells = (system, layout, f"{t.sent}/{t.received}", f"{t.nbytes / 1e6:.1f}",
             "-" if math.isnan(mean_mb) else f"{mean_mb:.1f}",
             "-" if math.isnan(mean_ms) else f"{mean_ms:.0f}",
             f"{t.failed}" + (f" ({reasons})" if reasons else ""))
    return "| " + " | ".join(cells) + " |"


def transfer_table(rows: list[tuple[str, str, Transfers | None]]) -> str:
    """(system, worker layout, its transfers or None: unknown) -> a markdown table."""
    head = ("| system | workers | KV transfers sent/received | MB moved | MB per transfer "
            "| asked -> KV ready, mean (ms) | failures |")
    return "\n".join([head, "|" + "---|" * 7, *(_row(*row) for row in rows)])
