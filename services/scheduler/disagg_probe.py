"""Before a decode worker gives up on a transfer at its deadline, it asks the prefill
worker where the request is (PrefillStatus). A peer that is alive but backlogged
answers queued / running / sending with a fresh prediction and the deadline runs
again from now; no answer within PROBE_TIMEOUT_S, an error or ``unknown`` and the
decode worker prefills the prompt itself, as before (``deadline``). So a deadline
catches a dead or stuck peer, not a slow, progressing one (a local fallback stalls
every decode stream of the worker while it prefills a long document).

Renewals are bounded two ways (either ends in the same fallback, ``stalled``):
- progress: after the first renewal, another one needs the transfer's state to have
  advanced (queued < running < sending) or the prefill scheduler to have completed a
  step since the last answer. A worker hung mid-step behind a scheduler that still
  answers "running" completes none, so it costs two deadlines, not forever. The
  predicted seconds count the tokens of steps in flight, so one long step is not
  mistaken for a hang. (Steps, not the prediction: a rate re-measured or a queue
  reordered moves the prediction either way without telling whether anything ran.)
- total: a transfer waits at most MAX_WAIT_DEADLINES times its first deadline from
  its PrefillRequest, however the peer answers (one that progresses but never gets to
  it, or one that misreports).

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
MAX_WAIT_DEADLINES = 4.0  # the first deadline is already 3x the prediction + 1 s
_RANK = {"queued": 0, "running": 1, "sending": 2}

Ask = Callable[[PrefillStatus], Awaitable[PrefillStatusReply]]


def _is(req: Req, tid: str) -> bool:
    return req.handoff is not None and req.handoff.transfer_id == tid


def prefill_status(core: SchedulerCore, tid: str, prefill_tps: float) -> PrefillStatusReply:
    """Where transfer ``tid`` is on this prefill worker. ``predicted_s``: the prefill
    tokens of the steps in flight, then those still to compute ahead of and including
    it (as ``queued_prefill_tokens`` counts them: unfinished prefills first, then the
    queue in order), over ``prefill_tps``."""
    done = core.steps - len(core.inflight)
    if any(_is(r, tid) for r in (*core.prefill.sampled, *core.prefill.sending)):
        return PrefillStatusReply(state="sending", completed_steps=done)
    ahead, computing = 0, False
    for step in core.inflight:  # NOTE: its last chunk sent, a prefill is in no backlog
        for item in step.items:
            ahead += 0 if item.decode else item.tokens
            computing |= _is(item.req, tid)
    in_flight = ahead
    for r, tokens in core.planner.prefill_backlog():
        ahead += tokens
        if _is(r, tid):
            state = "queued" if r in core.waiting else "running"
            return PrefillStatusReply(state=state, predicted_s=ahead / prefill_tps, completed_steps=done)
    if computing:
        return PrefillStatusReply(state="running", predicted_s=in_flight / prefill_tps, completed_steps=done)
    return PrefillStatusReply(state="unknown", completed_steps=done)


async def probe(book: DecodeBook, req: Req, ask: Ask, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Ask the prefill worker about ``req``, past its deadline. Returns "" when
    renewed (or settled meanwhile), else the reason the caller falls back for:
    ``deadline`` (no answer in time, an error, ``unknown``) or ``stalled`` (no
    progress since the last renewal, or past the total wait bound). One probe per
    transfer at a time: ``expired`` skips a request while it is probed."""
    t = req.transfer
    if not t.max_wait_s:
        t.max_wait_s = MAX_WAIT_DEADLINES * book.deadline_s(req)
    if time.monotonic() - t.sent_at >= t.max_wait_s:
        return "stalled"
    t.probing = True
    try:
        reply = await asyncio.wait_for(ask(PrefillStatus(transfer_id=t.transfer_id)), timeout_s)
    except (ServiceError, asyncio.TimeoutError):
        reply = None
    finally:
        t.probing = False
    if req.transfer is not t or t.transfer_id not in book.pending:
        return ""  # NOTE: settled meanwhile (arrived, failed, aborted): nothing to do
    if reply is None or reply.state not in _RANK:
        return "deadline"
    seen = (_RANK[reply.state], reply.completed_steps)
    if t.seen is not None and seen[0] <= t.seen[0] and seen[1] <= t.seen[1]:
        return "stalled"
    t.seen = seen
    book.renew(req, reply.predicted_s, time.monotonic())
    return ""
