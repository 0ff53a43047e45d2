"""A submitted request as seen by its consumer: merged deltas, finish, cleanup."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

from opentelemetry.trace import Span

from libs.protocol import ServiceError, errors
from libs.protocol.messages import Logprobs, TextDelta, Usage

from .logprobs import merge_logprobs
from .usage import prompt_only


# put in a request's queue when it waited request_timeout for output (identity-checked)
_TIMED_OUT = TextDelta(rid="", text="", token_ids=[])


class DeltaQueue(asyncio.Queue):
    """A submission's output deltas, and the generation reading them (once it is bound),
    which may take a plain delta without queueing it (:meth:`Generation.offer`)."""

    def __init__(self) -> None:
        super().__init__()
        self.generation: Generation | None = None


@dataclass
class Completion:
    """The whole output of a finished request (non-stream)."""

    rid: str
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    logprobs: Logprobs | None = None  # requests with return_logprob
    worker: str = ""  # the worker that finished it (another than the first after a move)


class Generation:
    """A submitted request: iterate it for merged deltas, close it to clean up.

    Iteration ends after the delta that carries ``finish_reason``; a finish with
    an error, or ``request_timeout`` without any delta, raises ServiceError.
    Closing before the finish aborts the request on its scheduler. If its worker
    is lost, even mid-stream, the request resumes elsewhere from the tokens
    delivered so far (``rid``, the public id, stays; ``bus_rid`` names the
    current submission); ``output_ids`` / ``emitted_chars`` are what the
    consumer got, so the resumed stream goes on with no gap and no repeat.
    """

    # the worker itself is fine: a blip of the bus (broker_unavailable: the scheduler lost a
    # step's reply) or a lost batch of output
    KEEP_WORKER = frozenset({"scheduler_lost", "tokenizer_lost", "stream_gap", "broker_unavailable"})
    RETRIABLE = KEEP_WORKER | {"worker_lost", "worker_failed"}
    MAX_RETRIES = 3  # lost workers, schedulers, tokenizers
    BLIPS = frozenset({"stream_gap", "broker_unavailable"})
    MAX_BLIPS = 12  # lost batches and bus blips: cheap to resume (the prefix is cached)

    def __init__(self, rid: str, worker_id: str, queue: asyncio.Queue[TextDelta],
                 prompt_tokens: int, span: Span, request_timeout: float,
                 on_close: Callable[["Generation"], None], *, started: float | None = None,
                 stream_span: Span | None = None,
                 on_first_token: Callable[["Generation"], None] | None = None) -> None:
        self.span = span
        self.stream_span = stream_span  # the response stream: submit -> finish
        self.started = time.perf_counter() if started is None else started
        self.first_token_at: float | None = None
        self.predicted_ttft: tuple[str, float] | None = None  # (policy, seconds) from the router
        self._on_first_token = on_first_token
        self.request_timeout = request_timeout
        self._on_close = on_close
        self.rid = rid
        self.bus_rid = rid
        self.worker_id = worker_id
        self.request: Any = None
        self._resubmit: Callable[["Generation", str, bool, str], Awaitable[None]] | None = None
        self.retries = 0
        self.blips = 0
        self._delivered = False
        self.output_ids: list[int] = []  # every token id handed to the consumer
        self.emitted_chars = 0  # characters of text handed to the consumer
        self.prompt_ids: list[int] = []  # set by the pipeline: what a resume replays
        self.seed: int | None = None  # the sampling seed every submission uses
        self.detok_instance = ""
        self.session = ""  # the scheduler session that accepted the submission
        self.failed_workers: list[str] = []  # lost workers a resume avoids
        self.bound_at = time.monotonic()  # when the current submission was accepted
        self._lost = False  # a watchdog already ended the current submission
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.finished = False
        self.closed = False
        self._queue = queue
        self._bind(queue)
        self._error: ServiceError | None = None
        self._gap: ServiceError | None = None  # found behind deltas that went out first
        self._waiting_since: float | None = None  # loop time the consumer began to wait
        self._timer: asyncio.TimerHandle | None = None  # the request_timeout check (_wait)
        # the consumer's writer of a plain text delta (see offer); None: every delta queued
        self.direct: Callable[[str], bool] | None = None
        self.direct_deltas = 0  # deltas that went out through ``direct``

    async def __aenter__(self) -> "Generation":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Idempotent and synchronous: abort if unfinished, release, forget the rid."""
        if not self.closed:
            self.closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._on_close(self)

    def __aiter__(self) -> AsyncIterator[TextDelta]:
        return self._deltas()

    async def _deltas(self) -> AsyncIterator[TextDelta]:
        # NOTE: an error is raised by next_delta, which may first resume the request
        while not (self.finished and self._error is None):
            yield await self.next_delta()

    def enable_retry(self, request: Any,
                     resubmit: Callable[["Generation", str, bool, str], Awaitable[None]]) -> None:
        self.request, self._resubmit = request, resubmit

    def rebind(self, bus_rid: str, worker_id: str, queue: asyncio.Queue[TextDelta],
               detok_instance: str = "", session: str = "") -> None:
        """Continue on a fresh submission (same public rid)."""
        self.bus_rid, self.worker_id, self._queue = bus_rid, worker_id, queue
        self._bind(queue)
        self._lost, self._gap = False, None
        self.detok_instance, self.session = detok_instance, session
        self.bound_at = time.monotonic()
        self._error, self.finished, self.finish_reason, self.usage = None, False, None, None
        self.span.set_attribute("radixmesh.worker", worker_id)

    async def next_delta(self) -> TextDelta:
        """Wait for output and merge whatever has arrived into one delta."""
        while True:
            try:
                delta = await self._next_delta()
            except ServiceError as exc:
                if not self._retriable(exc):
                    raise
                if exc.code in self.BLIPS:
                    self.blips += 1
                else:
                    self.retries += 1
                try:
                    # NOTE: a lost scheduler or tokenizer leaves a healthy worker behind: keep it
                    await self._resubmit(self, self.worker_id, exc.code not in self.KEEP_WORKER,
                                         exc.code)
                except ServiceError as failed:
                    self._error = failed
                    raise
                continue
            if not self._delivered and (delta.text or delta.token_ids):
                self._first_token()
            return delta

    def _first_token(self) -> None:
        self._delivered = True
        self.first_token_at = time.perf_counter()
        if self.stream_span is not None:
            self.stream_span.add_event("first_token")
        if self._on_first_token is not None:
            self._on_first_token(self)

    def _retriable(self, exc: ServiceError) -> bool:
        return (exc.code in self.RETRIABLE and self._resubmit is not None
                and not self.closed
                and (self.blips < self.MAX_BLIPS if exc.code in self.BLIPS else self.retries < self.MAX_RETRIES))

    def _bind(self, queue: asyncio.Queue[TextDelta]) -> None:
        if isinstance(queue, DeltaQueue):
            queue.generation = self

    def offer(self, item: TextDelta) -> bool:
        """Hand a plain continuation (text, no finish, no error, no logprobs, the next
        position) straight to the consumer's stream through ``direct``; False: queue it.

        NOTE: this is most of a stream's deltas, and on this path one costs an encode and a
        socket write: no queue, no task wake-up, no generator or middleware between them
        (docs/benchmarks.md, the mesh). Only while the consumer is parked waiting for output
        with nothing queued, so every event it sent before went out first, and only after
        the first token took the ordinary way (its metrics and span event).
        """
        if (self.direct is None or self._waiting_since is None or not self._delivered
                or item.finish_reason is not None or item.error is not None or item.logprobs is not None
                or (item.pos >= 0 and item.pos != len(self.output_ids)) or self.closed or self.finished
                or self._gap is not None or not self._queue.empty()):
            return False
        if item.text and not self.direct(item.text):
            return False  # NOTE: e.g. the client is slow and the server paused writing: queued
        self.output_ids.extend(item.token_ids)
        self.completion_tokens += len(item.token_ids)
        self.emitted_chars += len(item.text)
        self.direct_deltas += 1
        return True

    def lost(self, error: ServiceError) -> None:
        """The submission's scheduler or worker is gone (seen by a watchdog):
        end it with ``error``; a retriable one resumes on the next read."""
        if not self.finished and not self._lost:
            self._lost = True
            self._queue.put_nowait(TextDelta(rid=self.bus_rid, text="", token_ids=[],
                                             finish_reason="error", error=error.info()))

    async def _next_delta(self) -> TextDelta:
        if self._error is not None:
            raise self._error
        if self.finished:
            raise RuntimeError(f"request {self.rid} already finished")
        while True:
            if self._gap is not None:
                gap, self._gap = self._gap, None
                raise gap
            items = self._in_order(await self._take())
            if items:
                return self._merge(items)

    async def _take(self) -> list[TextDelta]:
        queue = self._queue
        first = queue.get_nowait() if not queue.empty() else await self._wait(queue)
        if first is _TIMED_OUT:
            self._error = errors.timeout(
                f"no output for {self.request_timeout:g}s (request {self.rid})"
            )
            raise self._error
        items = [first]
        while not self._queue.empty() and items[-1].finish_reason is None and items[-1].error is None:
            items.append(self._queue.get_nowait())
        return items

    async def _wait(self, queue: asyncio.Queue[TextDelta]) -> TextDelta:
        """The next delta, or _TIMED_OUT after ``request_timeout`` without one.

        NOTE: one timer per request, moved on only when it fires (``_check_wait``), not a
        timer set and cancelled per streamed delta (a visible share of the gateway's CPU
        per token: docs/benchmarks.md, the mesh)."""
        loop = asyncio.get_running_loop()
        self._waiting_since = loop.time()
        if self._timer is None:
            self._timer = loop.call_at(self._waiting_since + self.request_timeout, self._check_wait)
        try:
            return await queue.get()
        finally:
            self._waiting_since = None

    def _check_wait(self) -> None:
        self._timer = None
        if self._waiting_since is None or self.closed:
            return  # NOTE: not waiting now: the next wait sets a timer again
        due = self._waiting_since + self.request_timeout
        loop = asyncio.get_running_loop()
        if loop.time() >= due:
            self._queue.put_nowait(_TIMED_OUT)
        else:
            self._timer = loop.call_at(due, self._check_wait)

    def _in_order(self, items: list[TextDelta]) -> list[TextDelta]:
        """The deltas that continue the output the consumer has: repeats dropped; at a gap
        (a batch lost on the way) the rest is held back and the request resumes from here."""
        expected = len(self.output_ids)
        kept: list[TextDelta] = []
        for item in items:
            if item.pos < 0 or item.pos == expected:
                kept.append(item)
                expected += len(item.token_ids)
            elif item.pos + len(item.token_ids) > expected or item.finish_reason is not None:
                self._gap = errors.stream_gap(f"output of request {self.rid} lost on the way: "
                                              f"expected token {expected}, got {item.pos}")
                break
        return kept

    def _merge(self, items: list[TextDelta]) -> TextDelta:
        last = items[-1]
        if last.finish_reason is not None or last.error is not None:
            self.finished = True
            self.finish_reason = last.finish_reason or "error"
            self.usage = last.usage
        if last.error is not None or last.finish_reason == "error":
            info = last.error
            self._error = (ServiceError.from_info(info) if info is not None
                           else errors.internal(f"request {self.rid} failed"))
            items = items[:-1]
            if not any(i.text or i.token_ids for i in items):
                raise self._error
        token_ids = items[0].token_ids if len(items) == 1 else [t for i in items for t in i.token_ids]
        self.completion_tokens += len(token_ids)
        text = "".join(i.text for i in items)
        self.output_ids.extend(token_ids)
        self.emitted_chars += len(text)
        finish = None if self._error is not None else last.finish_reason
        if (self.retries or self.blips) and self.usage is not None:
            self.usage = prompt_only(self.usage)
        return TextDelta(rid=self.rid, text=text, token_ids=token_ids,
                         finish_reason=finish, usage=self.usage,
                         logprobs=merge_logprobs([i.logprobs for i in items]))

    @property
    def error(self) -> ServiceError | None:
        """Why the request failed (error finish or timeout), if it did."""
        return self._error

    @property
    def outcome(self) -> str:
        """finish_reason, or "aborted" when closed early, or "timeout"."""
        if self.finish_reason is not None:
            return self.finish_reason
        return "timeout" if self._error is not None else "aborted"

    def final_usage(self) -> Usage:
        """Usage from the finishing delta, else counted here."""
        if self.usage is not None:
            return self.usage
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)

    async def collect(self) -> Completion:
        """Run to the finish and return the whole output."""
        texts: list[str] = []
        ids: list[int] = []
        logprobs = []
        finish = "stop"
        async for delta in self:
            texts.append(delta.text)
            logprobs.append(delta.logprobs)
            ids.extend(delta.token_ids)
            finish = delta.finish_reason or finish
        if self._error is not None:
            raise self._error
        return Completion(self.rid, "".join(texts), ids, finish, self.final_usage(),
                          merge_logprobs(logprobs), self.worker_id)
