"""Before a decode worker gives up on a transfer at its deadline, it asks the prefill
worker where the request is (PrefillStatus). A peer that is alive but backlogged
answers queued / running / sending with a fresh prediction and the deadline runs
again from now; no answer within PROBE_TIMEOUT_S, an error or ``unknown`` and the
decode worker prefills the prompt itself, as before. So a deadline catches a dead
or stuck peer, not a slow, progressing one (a local fallback stalls every decode
stream of the worker while it prefills a long document).

``prefill_status`` is the prefill side's answer, from its books and queues;
``probe`` the decode side's question, with the book-keeping; no I/O here (the
caller passes ``ask``, the bus request).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Awaitable, Callable

from libs.protocol import ServiceError
from libs.protocol.messages import PrefillStatus, PrefillStatusReply

from .disagg import DecodeBook
from .request import Req

if TYPE_CHECKING:
    from .core import SchedulerCore

PROBE_TIMEOUT_S = 0.5

Ask = Callable[[PrefillStatus], Awaitable[PrefillStatusReply]]


def _is(req: Req, tid: str) -> bool:
    return req.handoff is not None and req.handoff.transfer_id == tid


def prefill_status(core: SchedulerCore, tid: str, prefill_tps: float) -> PrefillStatusReply:
    """Where transfer ``tid`` is on this prefill worker. ``predicted_s``: the prefill
    tokens still to compute ahead of and including it (as ``queued_prefill_tokens``
    counts them: unfinished prefills first, then the queue in order) over ``prefill_tps``."""
    if any(_is(r, tid) for r in (*core.prefill.sampled, *core.prefill.sending)):
        return PrefillStatusReply(state="sending")
    ahead = 0
    for r, tokens in core.planner.prefill_backlog():
        ahead += tokens
        if _is(r, tid):
            state = "queued" if r in core.waiting else "running"
            return PrefillStatusReply(state=state, predicted_s=ahead / prefill_tps)
    return PrefillStatusReply(state="unknown")


async def probe(book: DecodeBook, req: Req, ask: Ask, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Ask the prefill worker about ``req``, past its deadline; False if the caller
    must fall back (no answer in time, an error, ``unknown``), else True (renewed, or
    settled meanwhile). One
    probe per transfer at a time: ``expired`` skips a request while it is probed."""
    t = req.transfer
    t.probing = True
    try:
        reply = await asyncio.wait_for(ask(PrefillStatus(transfer_id=t.transfer_id)), timeout_s)
    except (ServiceError, asyncio.TimeoutError):
        reply = None
    finally:
        t.probing = False
    if req.transfer is not t or t.transfer_id not in book.pending:
        return True  # NOTE: settled meanwhile (arrived, failed, aborted): nothing to do
    if reply is None or reply.state == "unknown":
        return False
    book.renew(req, reply.predicted_s, time.monotonic())
    return True
