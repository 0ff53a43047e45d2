"""Spans of the requests one scheduler loop runs: queue wait, prefill chunks, decode.

A request submitted inside a sampled trace gets a :class:`RequestTrace`; its spans
are children of the submit's CONSUMER span, whichever step they happen in::

    scheduler.request     submit -> finish (prompt / cached / completion tokens)
      scheduler.queue     enqueue -> admission (again after a retraction)
      scheduler.prefill   one per chunk: step sent -> its result
      scheduler.decode    first token -> finish; a token-count event every TOKEN_EVENT_EVERY steps

A step that prefills a traced request sends its ForwardBatch in that chunk's
context, so the worker's spans join the request's trace; decode-only steps are
not traced (never a span per token). Retraction is an event on the request span
that closes the running phase and opens a new queue span.

NOTE: untraced requests cost nothing here (one dict check per step while no
request is traced); a traced one costs O(1) per step where it is queued, prefilled or
retracted, and on decode-only steps O(1) every TOKEN_EVENT_EVERY steps (its finish comes
through its delta).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span

from libs.protocol.messages import ErrorInfo, TokenDelta

from .request import Req

if TYPE_CHECKING:
    from .step import Step

TOKEN_EVENT_EVERY = 16

_tracer = trace.get_tracer("radixmesh.scheduler")


class RequestTrace:
    """The open spans of one traced request."""

    __slots__ = ("root", "ctx", "queue", "chunks", "decode", "marked", "resumed")

    def __init__(self, req: Req, parent: Context, worker_id: str) -> None:
        self.root = _tracer.start_span("scheduler.request", context=parent, attributes={
            "radixmesh.rid": req.rid, "radixmesh.worker": worker_id,
            "radixmesh.prompt_tokens": req.prompt_len,
            "radixmesh.max_new_tokens": req.sampling.max_new_tokens,
        })
        self.ctx = trace.set_span_in_context(self.root)
        self.queue: Span | None = self._start("scheduler.queue")
        self.chunks: deque[Span] = deque()  # prefill chunks in flight, oldest first
        self.decode: Span | None = None
        self.marked = 0  # completion tokens at the last decode event
        self.resumed = False

    def _start(self, name: str, attributes: dict | None = None) -> Span:
        return _tracer.start_span(name, context=self.ctx, attributes=attributes)

    def admitted(self, cached: int, from_host: int, from_store: int = 0) -> None:
        self.queue.set_attributes({"radixmesh.cached_tokens": cached,
                                   "radixmesh.cached_host_tokens": from_host,
                                   "radixmesh.cached_store_tokens": from_store})
        self.queue.end()
        self.queue = None

    def prefill(self, start: int, tokens: int, step: int) -> Span:
        chunk = self._start("scheduler.prefill", {
            "radixmesh.step": step, "radixmesh.chunk_start": start, "radixmesh.chunk_tokens": tokens,
        })
        self.chunks.append(chunk)
        return chunk

    def step_done(self, req: Req, prefill: bool, tick: bool = False) -> None:
        """``tick``: a step the tracer visits every TOKEN_EVENT_EVERY steps: a token event
        if any token came since the last one (the steps between may not be visited)."""
        if prefill and self.chunks:
            self.chunks.popleft().end()
        n = len(req.output_ids)
        if not n:
            return
        if self.decode is None:
            self.decode = self._start("scheduler.decode")
            self.decode.add_event("resumed" if self.resumed else "first_token",
                                  {"radixmesh.completion_tokens": n})
            self.marked = n
        elif n - self.marked >= TOKEN_EVENT_EVERY or (tick and n > self.marked):
            self.decode.add_event("tokens", {"radixmesh.completion_tokens": n})
            self.marked = n

    def retracted(self, req: Req) -> None:
        self.root.add_event("retracted", {"radixmesh.completion_tokens": len(req.output_ids)})
        for span in (*self.chunks, self.decode):
            if span is not None:
                span.set_attribute("radixmesh.retracted", True)
                span.end()
        self.chunks.clear()
        self.decode = None
        self.resumed = True
        self.queue = self._start("scheduler.queue", {"radixmesh.resumed": True})

    def finish(self, reason: str, completion: int, cached: int, error: ErrorInfo | None) -> None:
        for span in (self.queue, *self.chunks, self.decode):
            if span is not None:
                span.end()
        self.root.set_attributes({"radixmesh.finish_reason": reason,
                                  "radixmesh.completion_tokens": completion,
                                  "radixmesh.cached_tokens": cached})
        if error is not None:
            self.root.set_status(trace.StatusCode.ERROR, f"{error.code}: {error.message}")
        self.root.end()


class StepTracer:
    """Traces of one worker loop's requests, fed by the loop at submit and each step."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.traces: dict[str, RequestTrace] = {}
        # traced requests not decoding yet (queued, prefilling, retracted): the only ones a
        # decode-only step can change besides its token events (see step_started, step_done)
        self.unsettled: set[str] = set()

    def submitted(self, req: Req) -> None:
        """Call inside the submit handler: a sampled trace there makes ``req`` traced."""
        if trace.get_current_span().is_recording():
            self.traces[req.rid] = RequestTrace(req, otel_context.get_current(), self.worker_id)
            self.unsettled.add(req.rid)

    def step_started(self, step: "Step") -> Context | None:
        """Admissions, retractions and prefill chunks of the step about to be sent;
        returns the context to send it in (a traced chunk's), or None."""
        if not self.traces or (step.decode_only and not step.retracted and not self.unsettled):
            return None  # NOTE: nothing to admit, retract or chunk: no pass over the requests
        for req in step.retracted:
            if (t := self.traces.get(req.rid)) is not None:
                t.retracted(req)
                self.unsettled.add(req.rid)
        parent = None
        for item in step.items:
            if (t := self.traces.get(item.req.rid)) is None:
                continue
            if t.queue is not None:
                t.admitted(item.prefix_len, item.req.cached_host_tokens, item.req.cached_store_tokens)
            if not item.decode:
                chunk = t.prefill(item.prefix_len, item.tokens, step.number)
                parent = parent or trace.set_span_in_context(chunk)
        return parent

    def step_done(self, step: "Step") -> None:
        """After the core applied a step's result.

        NOTE: a decode-only step with every traced request decoding is visited only every
        TOKEN_EVENT_EVERY steps (for the token events): the requests it finishes end through
        their deltas (``finished``), so the steps between cost no pass over the requests."""
        tick = step.number % TOKEN_EVENT_EVERY == 0
        if not self.traces or (step.decode_only and not tick and not self.unsettled):
            return
        for item in step.items:
            req = item.req
            if (t := self.traces.get(req.rid)) is None:
                continue
            t.step_done(req, prefill=not item.decode, tick=tick)
            if t.decode is not None:
                self.unsettled.discard(req.rid)
            if req.finish_reason is not None:
                del self.traces[req.rid]
                self.unsettled.discard(req.rid)
                t.finish(req.finish_reason, len(req.output_ids), req.cached_tokens, req.error)

    def finished(self, deltas: dict[str, list[TokenDelta]]) -> None:
        """Requests that ended outside a step (abort, failure): from their last delta."""
        if not self.traces:
            return
        for items in deltas.values():
            for d in items:
                if d.finish_reason is not None:
                    self.ended(d.rid, d.finish_reason, d.completion_tokens, d.cached_tokens, d.error)

    def ended(self, rid: str, reason: str, completion_tokens: int = 0, cached_tokens: int = 0,
              error=None) -> None:
        """A request ended (also one that emits no deltas: a prefill for a decode worker)."""
        self.unsettled.discard(rid)
        if (t := self.traces.pop(rid, None)) is not None:
            t.finish(reason, completion_tokens, cached_tokens, error)
