"""tokenizer process: encodes prompts (queue group) and streams text to gateways.

Subjects::

    tokenizer.encode        EncodeRequest -> EncodeReply    queue group "tokenizer"
    tokenizer.detok.<me>    DetokBatch (one per scheduler step) | DetokRelease
    -> gw.<g>.out           GatewayBatch, one per gateway per DetokBatch
    -> sched.<w>.abort      AbortRequest(reason="stop") when a stop string matched
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

from opentelemetry import context as otel_context
from opentelemetry import trace

from libs.protocol import errors
from libs.protocol.messages import (
    AbortRequest, DetokBatch, DetokRelease, EncodeReply, EncodeRequest, GatewayBatch,
)
from libs.protocol.service import ServiceContext
from libs.protocol.subjects import TOKENIZER_QUEUE

from .detok import Detokenizer
from .encoder import Encoded, Encoder
from .streams import Streams

log = logging.getLogger("radixmesh.tokenizer")
_tracer = trace.get_tracer("radixmesh.tokenizer")


class EncodePool:
    """Runs :meth:`Encoder.encode` off the event loop, one tokenizer copy per thread."""

    def __init__(self, encoder: Encoder, threads: int) -> None:
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(max(1, threads), thread_name_prefix="encode")
        # NOTE: every thread's copy made here, at start: a 262,144-token tokenizer (Gemma 3) takes
        # ~20 s to copy on a busy machine, past the gateway's 10 s wait for a first request
        self._spare: queue.SimpleQueue[Encoder] = queue.SimpleQueue()
        for _ in range(max(1, threads)):
            self._spare.put(encoder.copy())

    def _encoder(self) -> Encoder:
        enc = getattr(self._local, "encoder", None)
        if enc is None:
            enc = self._local.encoder = self._spare.get_nowait()
        return enc

    async def encode(self, req: EncodeRequest) -> Encoded:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self._encoder().encode(req))

    def close(self) -> None:
        self._executor.shutdown(wait=False)


class TokenizerService:
    """Wires an Encoder and the detok Streams of this instance onto the bus."""

    def __init__(
        self, ctx: ServiceContext, encoder: Encoder, model_name: str,
        idle_timeout: float = 600.0, encode_threads: int = 1, max_streams: int = 65536,
    ) -> None:
        self.max_streams = max_streams  # open detok streams: past this, encodes get 503
        self.encoded = 0  # encode requests taken since start
        self.ctx = ctx
        self.encoder = encoder
        self.model_name = model_name
        self.idle_timeout = idle_timeout
        # NOTE: the detokenizer runs on the loop thread with its own tokenizer copy,
        # so it never shares a Rust tokenizer with the encode threads.
        self.streams = Streams(Detokenizer(encoder.copy().tokenizer))
        self.pool = EncodePool(encoder, encode_threads)

    async def start(self) -> None:
        s, bus, me = self.ctx.subjects, self.ctx.bus, self.ctx.config.instance
        self.ctx.stack.callback(self.pool.close)
        encode = await bus.subscribe(
            s.tokenizer_encode(), self._on_encode, EncodeRequest,
            queue=TOKENIZER_QUEUE, concurrent=True,
        )
        # NOTE: stopping, it leaves the queue group first: no encode reaches a closed pool
        self.ctx.stack.push_async_callback(encode.unsubscribe)
        # NOTE: detok is not concurrent: steps of a request must be handled in order.
        await bus.subscribe(s.tokenizer_detok(me), self._on_detok, DetokBatch | DetokRelease)
        sweeper = asyncio.create_task(self._sweep_loop(), name="detok-sweep")
        self.ctx.stack.callback(sweeper.cancel)
        self.ctx.detail["model"] = self.model_name
        self.ctx.probes["encoded"] = lambda: str(self.encoded)
        self._report()

    async def _on_encode(self, req: EncodeRequest) -> EncodeReply:
        if len(self.streams) >= self.max_streams and req.rid not in self.streams:
            raise errors.overloaded(f"tokenizer {self.ctx.config.instance} holds "
                                    f"{len(self.streams)} open requests; retry later")
        self.encoded += 1
        with _tracer.start_as_current_span("tokenizer.encode") as span:
            enc = await self.pool.encode(req)
            if span.is_recording():
                span.set_attributes({"radixmesh.rid": req.rid, "radixmesh.chat": req.messages is not None,
                                     "radixmesh.prompt_tokens": len(enc.input_ids)})
        # the request's detokenize span (tokenizer.detokenize) will be a child of this context
        traced = trace.get_current_span().is_recording()
        self._check_resume(req)
        try:
            self.streams.open(
                req.rid, req.gateway, len(enc.input_ids), req.stop, req.skip_special_tokens,
                trace_ctx=otel_context.get_current() if traced else None,
                output_ids=req.output_ids, emitted_chars=req.emitted_chars,
            )
        except ValueError as exc:
            raise errors.invalid_request(f"output_ids: {exc}") from None
        self._report()
        return EncodeReply(
            input_ids=enc.input_ids, max_new_tokens=enc.max_new_tokens,
            detok_instance=self.ctx.config.instance, max_model_len=enc.max_model_len,
            vocab_size=self.encoder.vocab_size,
        )

    def _check_resume(self, req: EncodeRequest) -> None:
        """A resumed request's output ids must be token ids; emitted_chars >= 0."""
        ids, vocab = req.output_ids, self.encoder.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= vocab):
            raise errors.invalid_request(f"output_ids must be token ids in [0, {vocab})")
        if req.emitted_chars < 0:
            raise errors.invalid_request("emitted_chars must not be negative")

    async def _on_detok(self, msg: DetokBatch | DetokRelease) -> None:
        if isinstance(msg, DetokRelease):
            self.streams.release(msg.rids)
        else:
            await self._step(msg)
        self._report()

    async def _step(self, batch: DetokBatch) -> None:
        out = self.streams.step(batch)
        s, bus = self.ctx.subjects, self.ctx.bus
        for gateway, items in out.per_gateway.items():
            await bus.publish(s.gateway_out(gateway), GatewayBatch(items=items))
        for rid, reason in out.aborts.items():
            await bus.publish(s.sched_abort(batch.worker_id), AbortRequest(rid=rid, reason=reason))

    async def _sweep_loop(self) -> None:
        interval = max(0.05, min(self.idle_timeout / 4, 30.0))
        while True:
            await asyncio.sleep(interval)
            idle = self.streams.sweep(self.idle_timeout)
            if idle:
                log.warning("dropped %d idle detok streams (e.g. %s)", len(idle), idle[0])
                self._report()

    def _report(self) -> None:
        self.ctx.detail["detok_streams"] = str(len(self.streams))
