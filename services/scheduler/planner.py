"""Plan one step: make room for decodes, continue chunked prefills, admit new work.

Token budget per step = ``chunked_prefill_size`` prefill tokens (decodes are
extra). A request is admitted only if available KV (free + evictable) covers
its uncached prompt plus its expected output (remaining x new_token_ratio) on
top of the expected growth of everything already running.

Planned ahead (a step still in flight, the overlap schedule), a decode reads
the token the step in flight samples (-1 on the wire); requests whose tokens in
flight end them are left out, and a step that would have to retract is not
planned ahead at all (``Plan.sync``): it waits for the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from libs.protocol.messages import ForwardBatch, NewRow

from .policy import order
from .request import Req

if TYPE_CHECKING:
    from .batcher import Batcher

SHARE_PROBE = 32  # tokens past the cached prefix that mark two prompts as sharing


@dataclass
class Plan:
    items: list[tuple[Req, int]] = field(default_factory=list)  # (request, tokens this step)
    slots: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    retracted: list[Req] = field(default_factory=list)
    sync: bool = False  # planned ahead, it would retract: plan it after the result
    decodes: list[bool] = field(default_factory=list)  # per item: a decode (else prefill)
    prefix_lens: list[int] = field(default_factory=list)  # per item, when built
    lp_counts: list[int] = field(default_factory=list)  # logprob positions asked, per item
    lp_windows: list[tuple[int, int, int]] = field(default_factory=list)  # logprob_window per item
    # set when sent: does the item sample a token; first token index of its logprobs
    # (-1: none) and whether it opens them with the unpredicted first token
    samples: list[bool] = field(default_factory=list)
    lp_first: list[int] = field(default_factory=list)
    lp_zero: list[bool] = field(default_factory=list)

    def to_batch(self, step: int) -> ForwardBatch:
        rows, prefix, extend, ids, new_rows = [], [], [], [], []
        lp = self.lp_windows = [logprob_window(req, n) for req, n in self.items]
        self.lp_counts = [w[1] for w in lp]
        self.decodes = [req.decoding for req, _ in self.items]
        self.prefix_lens = prefix
        for (req, n), decoding in zip(self.items, self.decodes):
            rows.append(req.row)
            prefix.append(req.kv_len)
            extend.append(n)
            if decoding:
                ids.append(-1 if req.ahead else req.output_ids[-1])
            else:
                ids.extend(req.fill()[req.kv_len : req.kv_len + n])
            if req.new_row:
                req.new_row = False
                new_rows.append(NewRow(
                    row=req.row, temperature=req.sampling.temperature, top_p=req.sampling.top_p,
                    top_k=req.sampling.top_k, seed=req.seed,
                    prefix_slots=req.all_slots()[: req.kv_len].tolist(),
                    **regex_fields(req),
                ))
        batch = ForwardBatch(step=step, new_rows=new_rows, rows=rows, prefix_lens=prefix,
                             extend_lens=extend, input_ids=ids, out_slots=self.slots.tolist())
        if any(self.lp_counts):
            batch.logprob_from, batch.logprob_count, batch.logprob_next = map(list, zip(*lp))
            batch.top_logprobs_num = [r.sampling.top_logprobs_num for r, _ in self.items]
        return batch


def regex_fields(req: Req) -> dict:
    """A constrained request's automaton for a new row: it starts after the output
    so far (replayed on a resume), and counts samples from the last fill chunk."""
    if not req.sampling.regex:
        return {}
    return dict(regex=req.sampling.regex, regex_from=req.fill_len,
                regex_tokens=list(req.output_ids), end_ids=req.end_ids)


def logprob_window(req: Req, n: int) -> tuple[int, int, int]:
    """(offset in the run, positions, token after the run or -1) of the next-token
    logprobs ``req`` needs from its run of ``n`` tokens starting at ``kv_len``.

    Position q predicts token q + 1; positions before ``lp_next - 1`` were reported
    already (a retracted request computes them again), and the run's last position
    predicts the sampled token, which is wanted unless nothing will be sampled.
    NOTE: ``kv_len`` and ``lp_next`` already count the steps in flight, whose
    sampled tokens (``ahead``) are not in ``fill`` yet.
    """
    if req.lp_next < 0:
        return -1, 0, -1
    k, end, fill_len = req.kv_len, req.kv_len + n, req.fill_len
    first = max(k, req.lp_next - 1)
    last = end == fill_len + req.ahead and req.remaining_tokens <= req.ahead
    stop = end - 1 if last else end
    if stop <= first:
        return -1, 0, -1
    return first - k, stop - first, req.fill()[end] if end < fill_len else -1


def prefix_cap(req: Req, page_size: int) -> int | None:
    """Longest cached prefix ``req`` may start from: a cached position has no logits,
    so every position from ``lp_next - 1`` on must be computed (SGLang does the same)."""
    if req.lp_next < 0:
        return None
    return max(req.lp_next - 1, 0) // page_size * page_size


def plan_step(b: "Batcher", ahead: bool = False) -> Plan:
    """The next step; ``ahead``: a step is still in flight."""
    plan = Plan()
    cfg = b.config
    max_len = b.info.max_model_len
    decode = [r for r in b.running if r.decoding and not r.ends_in_flight(max_len)]
    forced = bool(cfg.retract_interval and b.steps and b.steps % cfg.retract_interval == 0)
    if ahead and (forced or (decode and b.cache.available < len(decode))):
        plan.sync = True
        return plan
    if forced and len(decode) > 1:
        _retract(b, plan, _victims(decode)[0])
        decode = [r for r in b.running if r.decoding]
    while decode and b.cache.available < len(decode) and len(b.running) > 1:
        victim = _victims(b.running)[0]
        _retract(b, plan, victim)
        if victim in decode:
            decode.remove(victim)
    plan.items = [(r, 1) for r in decode]
    used = len(decode)
    budget = cfg.chunked_prefill_size
    for req in [r for r in b.running if not r.decoding]:  # unfinished prefills first
        n = min(budget, req.fill_len - req.kv_len, b.cache.available - used)
        if n > 0:
            plan.items.append((req, n))
            used, budget = used + n, budget - n
    if not plan.retracted:
        used = _admit(b, plan, used, budget)
    if plan.items:
        _allocate(b, plan, used)
    return plan


def _admit(b: "Batcher", plan: Plan, used: int, budget: int) -> int:
    cfg = b.config
    ratio = b.new_token_ratio
    reserved = sum(math.ceil(r.remaining_tokens * ratio) for r in b.running)
    for req in order(cfg.schedule_policy, b.waiting, b.cache):
        if budget <= 0 or b.rows.num_free == 0 or len(b.running) >= cfg.max_running_requests:
            break
        matched = b.cache.prefix_len(req)
        cap = prefix_cap(req, cfg.page_size)
        matched = matched if cap is None else min(matched, cap)
        if _shares_running_prefill(b, req, matched):
            continue  # wait one step: it will hit the prefix that is being computed
        extend = req.fill_len - matched
        expected = math.ceil(req.remaining_tokens * ratio)
        # NOTE: locking the matched prefix takes it out of the evictable pool.
        if b.cache.available - matched - used - reserved < extend + expected:
            break
        b.admit(req)
        n = min(budget, req.fill_len - req.kv_len)
        plan.items.append((req, n))
        used, budget, reserved = used + n, budget - n, reserved + expected
    return used


def _shares_running_prefill(b: "Batcher", req: Req, matched: int) -> bool:
    if b.cache.tree is None:
        return False
    fill = req.fill()
    end = matched + SHARE_PROBE
    if len(fill) < end:
        return False
    probe = fill[:end]
    return any(
        r.namespace == req.namespace and r.kv_len < end and r.fill_len >= end
        and r.fill()[:end] == probe
        for r in b.running if not r.decoding
    )


def _victims(reqs: list[Req]) -> list[Req]:
    """Cheapest to redo first: fewest outputs, then longest prompt."""
    return sorted(reqs, key=lambda r: (len(r.output_ids), -r.prompt_len))


def _retract(b: "Batcher", plan: Plan, req: Req) -> None:
    b.retract(req)
    plan.retracted.append(req)


def _allocate(b: "Batcher", plan: Plan, total: int) -> None:
    plan.slots = b.cache.alloc(total)
    start = 0
    for req, n in plan.items:
        req.slots.append(plan.slots[start : start + n])
        start += n
