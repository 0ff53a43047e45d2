"""Open detokenizer streams of one tokenizer instance, and per-step batch handling (no bus).

A stream is opened when this instance encodes a request and lives until its
final TextDelta, a DetokRelease, or ``idle_timeout`` without traffic.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from opentelemetry import trace

from libs.protocol import errors
from libs.protocol.messages import DetokBatch, ErrorInfo, Logprobs, TextDelta, TokenDelta, Usage

from .detok import DecodeState, Detokenizer, StepResult

_tracer = trace.get_tracer("radixmesh.tokenizer")


@dataclass(eq=False)
class Stream:
    rid: str
    gateway: str
    prompt_tokens: int
    decode: DecodeState
    last_seen: float
    cached_tokens: int = 0
    cached_host_tokens: int = 0
    cached_store_tokens: int = 0
    trace_ctx: Any = None  # the request's trace context; None: not traced
    first_ns: int = 0  # wall time of its first token delta (traced streams only)
    next_pos: int = 0  # TokenDelta.pos the next delta must carry


@dataclass
class StepOutput:
    """What one DetokBatch produced: deltas per gateway, rids to abort on the scheduler.

    ``aborts`` maps rid -> reason for requests this tokenizer ended while the
    scheduler still runs them ("stop": a stop string matched; "error").
    """

    per_gateway: dict[str, list[TextDelta]] = field(default_factory=dict)
    aborts: dict[str, str] = field(default_factory=dict)


class Streams:
    """rid -> Stream, plus the step function that turns token deltas into text deltas."""

    def __init__(self, detok: Detokenizer, clock: Callable[[], float] = time.monotonic) -> None:
        self._detok = detok
        self._clock = clock
        self._streams: dict[str, Stream] = {}

    def __len__(self) -> int:
        return len(self._streams)

    def __contains__(self, rid: str) -> bool:
        return rid in self._streams

    def open(
        self, rid: str, gateway: str, prompt_tokens: int,
        stop: list[str], skip_special_tokens: bool, trace_ctx: Any = None,
        output_ids: list[int] | None = None, emitted_chars: int = 0,
    ) -> None:
        """Start (or restart, for a retried encode) the stream of ``rid``; with
        ``trace_ctx`` its detokenization ends in one ``tokenizer.detokenize`` span.

        A resumed request passes the ``output_ids`` generated before its worker
        died and how many characters of their text the client got: the stream
        continues right after them (raises ValueError if they do not decode).
        """
        state = DecodeState(skip_special_tokens=skip_special_tokens, stop=tuple(stop))
        if output_ids:
            self._detok.prime(state, output_ids, emitted_chars)
        self._streams[rid] = Stream(rid, gateway, prompt_tokens, state, self._clock(),
                                    trace_ctx=trace_ctx, next_pos=len(output_ids or ()))

    def release(self, rids: list[str]) -> int:
        """Drop streams; returns how many existed."""
        return sum(self._streams.pop(rid, None) is not None for rid in rids)

    def sweep(self, idle_timeout: float) -> list[str]:
        """Drop streams idle for more than ``idle_timeout`` seconds; returns their rids."""
        cutoff = self._clock() - idle_timeout
        idle = [rid for rid, s in self._streams.items() if s.last_seen < cutoff]
        self.release(idle)
        return idle

    def step(self, batch: DetokBatch) -> StepOutput:
        """Detokenize one scheduler step. Unknown rids (already finished) are ignored."""
        now = self._clock()
        out = StepOutput()
        streams = self._streams
        pairs: list[tuple[Stream, TokenDelta]] = []
        for item in batch.items:
            s = streams.get(item.rid)
            if s is not None and (item.pos == s.next_pos or self._in_order(s, item, out)):
                s.next_pos += len(item.token_ids)
                pairs.append((s, item))
        results = self._detok.step(
            [s.decode for s, _ in pairs],
            [item.token_ids for _, item in pairs],
            [item.finish_reason is not None for _, item in pairs],
        )
        per_gateway = out.per_gateway
        for (stream, item), res in zip(pairs, results):
            stream.last_seen = now
            if stream.trace_ctx is not None and not stream.first_ns:
                stream.first_ns = time.time_ns()
            if item.cached_tokens:
                _note_cached(stream, item)
            if item.finish_reason is None and res.error is None and not res.stopped:
                if not res.text and not item.token_ids:
                    continue
                lp = item.logprobs
                delta = TextDelta(rid=stream.rid, text=res.text, token_ids=item.token_ids, pos=item.pos,
                                  logprobs=None if lp is None else self._with_texts(lp))
            else:
                delta = self._final_delta(stream, item, res)
            gateway_items = per_gateway.get(stream.gateway)
            if gateway_items is None:
                gateway_items = per_gateway[stream.gateway] = []
            gateway_items.append(delta)
            if delta.finish_reason is not None:
                del streams[stream.rid]
                if item.finish_reason is None:
                    out.aborts[stream.rid] = delta.finish_reason
                if stream.trace_ctx is not None:
                    _detok_span(stream, delta.finish_reason)
        return out

    def _in_order(self, stream: Stream, item: TokenDelta, out: StepOutput) -> bool:
        """True: ``item`` is the stream's next delta. A repeat is dropped; a gap (a batch
        lost on the way) ends the stream with ``stream_gap`` so the gateway resumes it."""
        if item.pos < 0 or item.pos == stream.next_pos:
            return True
        if item.pos + len(item.token_ids) <= stream.next_pos and item.finish_reason is None:
            return False  # NOTE: all of it delivered before
        del self._streams[stream.rid]
        out.aborts[stream.rid] = "error"
        gap = errors.stream_gap(f"token batch lost: expected token {stream.next_pos}, got {item.pos}")
        out.per_gateway.setdefault(stream.gateway, []).append(TextDelta(
            rid=stream.rid, text="", token_ids=[], finish_reason="error", error=gap.info(), pos=item.pos))
        return False

    def _final_delta(self, stream: Stream, item: TokenDelta, res: StepResult) -> TextDelta:
        """The last delta of a stream: finished by the scheduler, a stop string or an error."""
        finish, error = item.finish_reason, item.error
        if res.error is not None and finish is None:
            finish, error = "error", ErrorInfo(code="internal_error", message=res.error)
        elif finish is None:
            finish = "stop"
        usage = Usage(
            prompt_tokens=item.prompt_tokens or stream.prompt_tokens,
            completion_tokens=item.completion_tokens or stream.decode.num_tokens,
            cached_tokens=stream.cached_tokens, cached_host_tokens=stream.cached_host_tokens,
            cached_store_tokens=stream.cached_store_tokens,
        )
        return TextDelta(
            rid=stream.rid, text=res.text, token_ids=item.token_ids,
            finish_reason=finish, error=error, usage=usage,
            logprobs=self._with_texts(item.logprobs), pos=item.pos,
        )

    def _with_texts(self, lp: Logprobs | None) -> Logprobs | None:
        """Fill in the text of every token of ``lp`` (one decode call for all of them), and
        the bytes where a token is not whole characters."""
        if lp is None:
            return None
        flat = [t for row in lp.top_ids for t in row]
        texts = self._detok.token_texts(lp.token_ids + flat)
        lp.tokens, rest = texts[: len(lp.token_ids)], texts[len(lp.token_ids):]
        ends = list(itertools.accumulate(len(row) for row in lp.top_ids))
        lp.top_tokens = [rest[e - len(row) : e] for e, row in zip(ends, lp.top_ids)]
        raw = self._detok.token_bytes(lp.token_ids + flat, texts)
        if raw is not None:  # NOTE: only where a token is part of a character
            lp.token_bytes, rest_raw = raw[: len(lp.token_ids)], raw[len(lp.token_ids):]
            lp.top_bytes = [rest_raw[e - len(row) : e] for e, row in zip(ends, lp.top_ids)]
        return lp


def _note_cached(stream: Stream, item: TokenDelta) -> None:
    """The most prompt tokens any delta said were cached (by tier)."""
    stream.cached_tokens = max(stream.cached_tokens, item.cached_tokens)
    stream.cached_host_tokens = max(stream.cached_host_tokens, item.cached_host_tokens)
    stream.cached_store_tokens = max(stream.cached_store_tokens, item.cached_store_tokens)


def _detok_span(stream: Stream, finish_reason: str) -> None:
    """One span per request: first token delta -> finish (never a span per step)."""
    _tracer.start_span("tokenizer.detokenize", context=stream.trace_ctx, start_time=stream.first_ns,
                       attributes={"radixmesh.rid": stream.rid,
                                   "radixmesh.completion_tokens": stream.decode.num_tokens,
                                   "radixmesh.finish_reason": finish_reason,
                                   "radixmesh.stop_string": stream.decode.stopped}).end()
