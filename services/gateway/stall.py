"""Open requests whose output went quiet: was a batch lost on the way?

Every delta carries its position in the output, so a lost batch shows as a gap when the
next one arrives, except the last: a lost final delta leaves nothing to arrive. For each
request quiet for ``stall_s``, the gateway asks its scheduler (one request per worker) how
many tokens it has put in deltas. A request counts as lost only when output the scheduler
had sent (or its finish) at one probe has still not arrived a whole ``stall_s`` later: on a
loaded machine deltas may queue for a while on the way, and that is no loss.
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
        self._suspect: dict[str, tuple[float, int]] = {}  # rid -> (when, what its scheduler had sent)

    def note(self, item: TextDelta, now: float | None = None) -> None:
        """Output of ``item.rid`` arrived (``now``: the batch's time, read once for all of it)."""
        end = item.pos + len(item.token_ids) if item.pos >= 0 else -1
        _, last = self._seen.get(item.rid, (0.0, -1))
        self._seen[item.rid] = (time.monotonic() if now is None else now, max(end, last))
        if self._suspect:
            self._suspect.pop(item.rid, None)

    def forget(self, rid: str) -> None:
        self._seen.pop(rid, None)
        self._suspect.pop(rid, None)

    def confirm(self, found: list[tuple[Generation, int, int]], wait_s: float) -> list[tuple[Generation, str]]:
        """Of (generation, arrived up to, sent by its scheduler) pairs that look short, those
        that already looked short ``wait_s`` ago with nothing arrived since; the rest are noted."""
        now, lost = time.monotonic(), []
        for gen, pos, sent in found:
            since, before = self._suspect.setdefault(gen.bus_rid, (now, sent))
            if now - since < wait_s:
                continue
            if before < 0:
                lost.append((gen, "the scheduler no longer holds it and its end never arrived"))
            elif before > pos:
                lost.append((gen, f"{before - pos} tokens sent {now - since:.0f}s ago never arrived"))
            self._suspect.pop(gen.bus_rid, None)
        return lost

    def quiet(self, gens: Iterable[Generation], stall_s: float) -> list[tuple[Generation, int]]:
        """The unfinished generations with no output for ``stall_s``, each with the position
        its output has arrived up to."""
        now, out = time.monotonic(), []
        for gen in gens:
            at, pos = self._seen.get(gen.bus_rid, (gen.bound_at, -1))
            if not gen.finished and now - max(at, gen.bound_at) > stall_s:
                out.append((gen, max(pos, len(gen.output_ids))))
        return out


async def short_output(bus: Bus, subjects: Subjects, quiet: list[tuple[Generation, int]],
                       timeout: float) -> list[tuple[Generation, int, int]]:
    """Of ``quiet``, the generations whose scheduler sent more than arrived (or holds them no
    more): (generation, arrived up to, sent; -1: not held); a scheduler that does not answer
    judges nothing (its loss is watched apart)."""
    by_worker: dict[str, list[tuple[Generation, int]]] = defaultdict(list)
    for gen, pos in quiet:
        by_worker[gen.worker_id].append((gen, pos))

    async def ask(worker: str, gens: list[tuple[Generation, int]]) -> list[tuple[Generation, int, int]]:
        try:
            reply = await bus.request(subjects.sched_status(worker),
                                      StreamStatusRequest(rids=[g.bus_rid for g, _ in gens]),
                                      StreamStatusReply, timeout=timeout)
        except ServiceError as exc:
            log.debug("stream status from %s: %s", worker, exc)
            return []
        return [(gen, pos, sent) for (gen, pos), sent in zip(gens, reply.sent) if sent < 0 or sent > pos]

    found = await asyncio.gather(*(ask(w, g) for w, g in by_worker.items()))
    return [pair for part in found for pair in part]
