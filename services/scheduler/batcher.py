"""Continuous batching for one worker, with no I/O: queues in, ForwardBatch out.

Each step the running requests decode one token and FCFS-admitted requests
prefill their prompt in the same batch. Admission budgets KV slots: a request
is admitted only if the free slots cover its whole prompt plus every token it
may still generate, on top of what running requests may still need, so a
running request never runs out of KV.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from libs.protocol import errors
from libs.protocol.messages import (
    ErrorInfo, ForwardBatch, ForwardResult, NewRow, SchedStats, TokenDelta, WorkerInfo,
)

from .allocator import RowAllocator, SlotAllocator
from .request import Req


@dataclass(frozen=True)
class BatcherConfig:
    max_running_requests: int = 256
    max_queued_requests: int = 4096
    max_prefill_tokens: int = 8192  # per step; a longer single prompt still runs alone


class Batcher:
    def __init__(self, info: WorkerInfo, config: BatcherConfig) -> None:
        self.info = info
        self.config = config
        self.slots = SlotAllocator(info.kv_slots)
        self.rows = RowAllocator(info.max_requests)
        self.eos = frozenset(info.eos_token_ids)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self._by_rid: dict[str, Req] = {}
        self._reserved = 0  # tokens running requests may still append to KV
        self._out: list[tuple[str, TokenDelta]] = []
        self._in_flight: list[Req] = []
        self.steps = 0
        self.tokens_generated = 0
        self.requests_finished = 0
        self.batch_sizes: Counter[int] = Counter()

    # -- intake ---------------------------------------------------------------

    def submit(self, req: Req) -> int:
        if req.rid in self._by_rid:
            raise errors.invalid_request(f"request id {req.rid} is already queued")
        if len(self.waiting) >= self.config.max_queued_requests:
            raise errors.overloaded(
                f"server is busy: {len(self.waiting)} requests already queued "
                f"(--max-queued-requests={self.config.max_queued_requests}); retry later"
            )
        if req.prompt_len + req.sampling.max_new_tokens > self.info.max_model_len:
            raise errors.context_length_exceeded(
                f"prompt ({req.prompt_len}) + max_new_tokens ({req.sampling.max_new_tokens}) "
                f"exceeds the model's context length {self.info.max_model_len}"
            )
        if req.max_total_len > self.info.kv_slots:
            raise errors.invalid_request(
                f"request needs up to {req.max_total_len} KV slots; this worker has "
                f"{self.info.kv_slots}: lower max_tokens"
            )
        if any(t < 0 or t >= self.info.vocab_size for t in req.input_ids):
            raise errors.invalid_request(f"token ids must lie in [0, {self.info.vocab_size})")
        self.waiting.append(req)
        self._by_rid[req.rid] = req
        return len(self.waiting) - 1

    def abort(self, rid: str, reason: str = "abort") -> bool:
        req = self._by_rid.get(rid)
        if req is None:
            return False
        req.aborted = True
        if req in self.waiting:
            self.waiting.remove(req)
            self._finish(req, "abort")
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ---------------------------------------------------------------

    def next_batch(self) -> ForwardBatch | None:
        """Admit what fits, allocate slots and build the step's ForwardBatch."""
        self._reap_aborted()
        admitted = self._admit()
        reqs = self.running + admitted
        self.running = reqs
        if not reqs:
            return None
        rows, prefix_lens, extend_lens, input_ids, new_rows = [], [], [], [], []
        decode = [r for r in reqs if r.kv_len > 0]
        # NOTE: decoding requests add one token each; their slots come in one bulk call.
        decode_slots = self.slots.alloc(len(decode)) if decode else np.empty(0, np.int64)
        out_slots: list[np.ndarray] = [decode_slots]
        for i, r in enumerate(decode):
            r.slots.append(decode_slots[i : i + 1])
            rows.append(r.row)
            prefix_lens.append(r.kv_len)
            extend_lens.append(1)
            input_ids.append(r.output_ids[-1])
        for r in admitted:
            slots = self.slots.alloc(r.prompt_len)
            r.slots.append(slots)
            out_slots.append(slots)
            rows.append(r.row)
            prefix_lens.append(0)
            extend_lens.append(r.prompt_len)
            input_ids.extend(r.input_ids)
            new_rows.append(NewRow(
                row=r.row, temperature=r.sampling.temperature, top_p=r.sampling.top_p,
                top_k=r.sampling.top_k, seed=r.seed,
            ))
        self._in_flight = decode + admitted
        self.steps += 1
        self.batch_sizes[len(self._in_flight)] += 1
        return ForwardBatch(
            step=self.steps, new_rows=new_rows, rows=rows, prefix_lens=prefix_lens,
            extend_lens=extend_lens, input_ids=input_ids,
            out_slots=np.concatenate(out_slots).tolist(),
        )

    def complete(self, result: ForwardResult) -> None:
        """Apply the sampled tokens of the batch returned by the last next_batch."""
        reqs, self._in_flight = self._in_flight, []
        if len(result.next_token_ids) != len(reqs):
            raise errors.internal(
                f"worker returned {len(result.next_token_ids)} tokens for {len(reqs)} requests"
            )
        for req, token in zip(reqs, result.next_token_ids):
            req.kv_len += 1 if req.output_ids else req.prompt_len
            if req.aborted:
                self._finish(req, "abort")
                continue
            req.output_ids.append(token)
            self.tokens_generated += 1
            reason = self._finish_reason(req, token)
            if reason:
                self._finish(req, reason, [token])
            else:
                self._out.append((req.detok_instance, TokenDelta(rid=req.rid, token_ids=[token])))
        self.running = [r for r in self.running if r.finish_reason is None]

    def fail_all(self, error: ErrorInfo) -> None:
        """The worker is gone: every request ends with ``error``."""
        for req in list(self.waiting) + self.running:
            req.error = error
            self._finish(req, "error")
        self.waiting.clear()
        self.running = []
        self._in_flight = []

    def take_deltas(self) -> list[tuple[str, TokenDelta]]:
        """(detok instance, delta) pairs produced since the last call."""
        out, self._out = self._out, []
        return out

    def stats(self) -> SchedStats:
        return SchedStats(
            worker_id=self.info.worker_id, steps=self.steps, running=len(self.running),
            waiting=len(self.waiting), free_slots=self.slots.num_free,
            max_batch_size=max(self.batch_sizes, default=0),
            batch_size_hist=dict(self.batch_sizes), tokens_generated=self.tokens_generated,
            requests_finished=self.requests_finished,
        )

    # -- internals -------------------------------------------------------------

    def _admit(self) -> list[Req]:
        admitted: list[Req] = []
        budget = self.config.max_prefill_tokens
        while self.waiting:
            req = self.waiting[0]
            if len(self.running) + len(admitted) >= self.config.max_running_requests:
                break
            if self.rows.num_free == 0:
                break
            if self.slots.num_free - self._reserved < req.max_total_len:
                break
            if admitted and req.prompt_len > budget:
                break
            self.waiting.popleft()
            req.row = self.rows.alloc()
            self._reserved += req.max_total_len
            budget -= req.prompt_len
            admitted.append(req)
        return admitted

    def _finish_reason(self, req: Req, token: int) -> str | None:
        if token in req.sampling.stop_token_ids:
            return "stop"
        if not req.sampling.ignore_eos and token in self.eos:
            return "stop"
        if req.remaining_tokens <= 0:
            return "length"
        if req.prompt_len + len(req.output_ids) >= self.info.max_model_len:
            return "length"
        return None

    def _reap_aborted(self) -> None:
        for req in [r for r in self.running if r.aborted]:
            self._finish(req, "abort")
        self.running = [r for r in self.running if r.finish_reason is None]

    def _finish(self, req: Req, reason: str, tokens: list[int] | None = None) -> None:
        req.finish_reason = reason
        if req.row >= 0:
            self.slots.free(req.all_slots())
            req.slots.clear()
            self.rows.free(req.row)
            self._reserved -= req.max_total_len
            req.row = -1
        self._by_rid.pop(req.rid, None)
        self.requests_finished += 1
        self._out.append((req.detok_instance, TokenDelta(
            rid=req.rid, token_ids=tokens or [], finish_reason=reason, error=req.error,
            prompt_tokens=req.prompt_len, completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
        )))
