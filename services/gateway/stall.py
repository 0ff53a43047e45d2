"""Open requests whose output went quiet: was a batch lost on the way?

Every delta carries its position in the output, so a lost batch shows as a gap when the
next one arrives, except the last: a lost final delta leaves nothing to arrive. For each
request quiet for ``stall_s``, the gateway asks its scheduler (one request per worker) how
many tokens it has put in deltas; more than arrived here, or a request the scheduler no
longer holds, means output was lost, and the request resumes from what its client has.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Iterable

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import StreamStatusReply, StreamStatusRequest, TextDelta

from .generation import Generation

log = logging.getLogger("radixmesh.gateway.stall")


class Arrivals:
    """When output of each submission (bus rid) last arrived, and up to which position."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, int]] = {}

    def note(self, item: TextDelta) -> None:
        end = item.pos + len(item.token_ids) if item.pos >= 0 else -1
        _, last = self._seen.get(item.rid, (0.0, -1))
        self._seen[item.rid] = (time.monotonic(), max(end, last))

    def forget(self, rid: str) -> None:
        self._seen.pop(rid, None)

    def quiet(self, gens: Iterable[Generation], stall_s: float) -> list[tuple[Generation, int]]:
        """The unfinished generations with no output for ``stall_s``, each with the position
        its output has arrived up to."""
        now, out = time.monotonic(), []
        for gen in gens:
            at, pos = self._seen.get(gen.bus_rid, (gen.bound_at, -1))
            if not gen.finished and now - max(at, gen.bound_at) > stall_s:
                out.append((gen, max(pos, len(gen.output_ids))))
        return out


async def lost_output(bus: Bus, subjects: Subjects, quiet: list[tuple[Generation, int]],
                      timeout: float) -> list[tuple[Generation, str]]:
    """Of ``quiet``, the generations whose scheduler sent more than arrived (or holds them no
    more), with why; a scheduler that does not answer judges nothing (its loss is watched apart)."""
    by_worker: dict[str, list[tuple[Generation, int]]] = defaultdict(list)
    for gen, pos in quiet:
        by_worker[gen.worker_id].append((gen, pos))

    async def ask(worker: str, gens: list[tuple[Generation, int]]) -> list[tuple[Generation, str]]:
        try:
            reply = await bus.request(subjects.sched_status(worker),
                                      StreamStatusRequest(rids=[g.bus_rid for g, _ in gens]),
                                      StreamStatusReply, timeout=timeout)
        except ServiceError as exc:
            log.debug("stream status from %s: %s", worker, exc)
            return []
        return [(gen, "the scheduler no longer holds it" if sent < 0 else f"{sent - pos} tokens sent never arrived")
                for (gen, pos), sent in zip(gens, reply.sent) if sent < 0 or sent > pos]

    found = await asyncio.gather(*(ask(w, g) for w, g in by_worker.items()))
    return [pair for part in found for pair in part]
