"""One step as planned: a list of per-request items, and its ForwardBatch.

An item is one request's run of tokens this step: a decode (one token) or a
prefill chunk. What the item will sample and which logprobs it reports is fixed
when the step is sent (``Step.launch``), because later steps are planned on top
of it before its result arrives (the overlap schedule).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from libs.protocol.extras import row_extras
from libs.protocol.messages import ForwardBatch, NewRow

from .request import Req


@dataclass(eq=False, slots=True)
class StepItem:
    req: Req
    tokens: int  # tokens this step computes for ``req``
    decode: bool = False
    prefix_len: int = 0  # req.kv_len when the batch was built
    # logprob_window: (offset in the run, positions, token after the run or -1)
    lp_window: tuple[int, int, int] = (-1, 0, -1)
    samples: bool = False  # the run ends at the fill: its last position samples a token
    lp_first: int = -1  # token index of its first logprob (-1: none)
    lp_zero: bool = False  # its logprobs open with token 0, which nothing predicts

    @property
    def lp_count(self) -> int:
        return self.lp_window[1]


@dataclass(eq=False)
class Step:
    """A step: planned, then sent (``number`` set), then answered."""

    items: list[StepItem] = field(default_factory=list)
    retracted: list[Req] = field(default_factory=list)
    sync: bool = False  # planned ahead it would retract: plan it after the result
    slots: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    number: int = 0
    copied: int = 0  # tokens of KV its copies move (host tier: down or back up)
    logprobs: bool = False  # some item's request wants logprobs (set by to_batch)
    pending: object | None = None  # the transport's handle on the reply (a future)
    decode_only: bool = False  # every item is a decode the planner chose (set by the planner)
    slot_ids: list[int] | None = None  # ``slots`` as a list (decode-only steps: the planner made it)

    def to_batch(self, number: int) -> ForwardBatch:
        self.number = number
        if self.decode_only:
            return self._decode_batch(number)
        rows, prefix, extend, ids, new_rows = [], [], [], [], []
        for item in self.items:
            req, n = item.req, item.tokens
            # NOTE: the planner made its decodes decode=True; only the rest is asked
            item.decode, item.prefix_len = item.decode or req.decoding, req.kv_len
            if req.lp_next >= 0:  # NOTE: (-1, 0, -1), the default, otherwise
                item.lp_window = logprob_window(req, n)
                self.logprobs = True
            rows.append(req.row)
            prefix.append(req.kv_len)
            extend.append(n)
            if item.decode:
                ids.append(-1 if req.ahead else req.output_ids[-1])
            else:
                ids.extend(req.fill()[req.kv_len : req.kv_len + n])
            if req.new_row:
                req.new_row = False
                new_rows.append(new_row(req))
        batch = ForwardBatch(step=number, new_rows=new_rows, rows=rows, prefix_lens=prefix,
                             extend_lens=extend, input_ids=ids, out_slots=self.slots.tolist())
        if self.logprobs and any(item.lp_count for item in self.items):
            windows = [item.lp_window for item in self.items]
            batch.logprob_from, batch.logprob_count, batch.logprob_next = map(list, zip(*windows))
            batch.top_logprobs_num = [item.req.sampling.top_logprobs_num for item in self.items]
        return batch

    def _decode_batch(self, number: int) -> ForwardBatch:
        """``to_batch`` of a decode-only step (most steps): one token per request, each
        request's last sampled token (-1: the step in flight samples it) as its input.
        NOTE: one short pass per request, and the only one before the result: it hands each
        request its slot and counts the step as launched for it (``launch``), since this runs
        every step for the whole batch."""
        rows, prefix, ids, new_rows = [], [], [], []
        slots = self.slots.tolist() if self.slot_ids is None else self.slot_ids  # NOTE: None: no item
        for item, slot in zip(self.items, slots):
            req = item.req
            req.kv.decoded.append(slot)
            k = item.prefix_len = req.kv_len
            rows.append(req.row)
            prefix.append(k)
            ids.append(-1 if req.ahead else req.output_ids[-1])
            if req.lp_next >= 0:
                item.lp_window = logprob_window(req, 1)
                self.logprobs = True
            if req.new_row:
                req.new_row = False
                new_rows.append(new_row(req))
            # NOTE: launched (see launch): a decode writes one position and always samples
            req.kv_len = k + 1
            req.ahead += 1
            item.samples = True
        batch = ForwardBatch(step=number, new_rows=new_rows, rows=rows, prefix_lens=prefix,
                             extend_lens=[1] * len(rows), input_ids=ids, out_slots=slots)
        if self.logprobs and any(item.lp_count for item in self.items):
            windows = [item.lp_window for item in self.items]
            batch.logprob_from, batch.logprob_count, batch.logprob_next = map(list, zip(*windows))
            batch.top_logprobs_num = [item.req.sampling.top_logprobs_num for item in self.items]
        return batch

    def launch(self) -> None:
        """The step is sent: its KV positions count as written (later steps run
        after it), its sampled tokens as ``ahead``, its logprobs as reported."""
        launched = self.decode_only  # NOTE: _decode_batch counted its positions and samples
        if launched and not self.logprobs:
            return
        for item in self.items:
            req = item.req
            take = req.lp_next >= 0 and (item.lp_count > 0 or req.lp_next == 0)
            item.lp_zero = take and req.lp_next == 0  # nothing predicts token 0
            if take:
                item.lp_first = max(req.lp_next, 1)
                req.lp_next = item.lp_first + item.lp_count
            if launched:
                continue
            req.kv_len += item.tokens
            item.samples = req.kv_len >= req.fill_len + req.ahead
            req.ahead += item.samples


def new_row(req: Req) -> NewRow:
    s = req.sampling
    return NewRow(row=req.row, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                  seed=req.seed, prefix_slots=req.kv.all_slots()[: req.kv_len].tolist(),
                  extras=row_extras(s, req.input_ids, req.output_ids), **regex_fields(req))


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
