"""Several choices per request (OpenAI's ``n``; SGLang's ``n`` in sampling_params).

Each choice is a request of its own on the bus, named ``<id>/<i>`` (so
/abort_request of the response's id ends them all). Seeds: with a seed ``s``,
choice ``i`` samples with ``s + i`` (int64, wrapping), as vLLM does, so choice 0
is what ``n = 1`` gives; without one every choice draws its own.

The prompt is computed once: choice 0 of a prompt is submitted first, and once its
scheduler holds it (the cache index has booked the prompt's pages on that worker)
the others follow; they are routed to those pages, where the scheduler has them
wait for the prefill in progress instead of computing it again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import AsyncIterator, Awaitable, Callable, Sequence

import msgspec

from libs.protocol import ServiceError, tracing

from .chat_stream import ChoiceStream
from .errors import ApiError
from .formats import OpenAIFormat, choices_usage
from .generation import Completion, Generation
from .limits import Deadline
from .logprobs import LogprobStream
from .request import GenerationRequest
from .sse import SSE_DONE, sse_event

Submit = Callable[[GenerationRequest], Awaitable[Generation]]


def choice_requests(req: GenerationRequest, n: int) -> list[GenerationRequest]:
    """``n`` copies of ``req``, choice i seeded ``seed + i``."""
    if n == 1:
        return [req]
    return [dataclasses.replace(req, params=msgspec.structs.replace(req.params, seed=_seed(req.params.seed, i)))
            for i in range(n)]


def _seed(seed: int | None, i: int) -> int | None:
    if seed is None:
        return None
    return (seed + i + (1 << 63)) % (1 << 64) - (1 << 63)


async def open_choices(submit: Submit, reqs: list[GenerationRequest], n: int,
                       base: str) -> list[Generation]:
    """Submit every choice (``n`` per prompt, in order) as ``<base>/<i>``: each
    prompt's first, then its others. A failure or cancellation closes what was
    opened (aborting it); a failure raises the first error.
    """
    opened: list[Generation | None] = [None] * len(reqs)

    async def one(i: int) -> None:
        tracing.request_id.set(f"{base}/{i}")  # NOTE: task-local
        opened[i] = await submit(reqs[i])

    async def prompt(start: int) -> None:
        await one(start)
        async with asyncio.TaskGroup() as group:
            for i in range(start + 1, start + n):
                group.create_task(one(i))

    try:
        async with asyncio.TaskGroup() as group:
            for start in range(0, len(reqs), n):
                group.create_task(prompt(start))
    except BaseException as exc:
        close_all([g for g in opened if g is not None])
        if isinstance(exc, BaseExceptionGroup):
            raise _first(exc) from None
        raise
    return opened  # type: ignore[return-value]


def _first(group: BaseExceptionGroup) -> BaseException:
    exc = group.exceptions[0]
    return _first(exc) if isinstance(exc, BaseExceptionGroup) else exc


def close_all(gens: list[Generation]) -> None:
    for gen in gens:
        gen.close()


async def collect_all(gens: list[Generation]) -> list[Completion]:
    """Every choice's whole output; the others are aborted when one fails."""
    try:
        return list(await asyncio.gather(*(gen.collect() for gen in gens)))
    finally:
        close_all(gens)


async def merged_events(gens: list[Generation], fmt: OpenAIFormat, deadline: Deadline,
                        tools: bool = False,
                        logprobs: Sequence[LogprobStream | None] = ()) -> AsyncIterator[bytes]:
    """One OpenAI stream of every choice: chunks carry the choice's ``index``, in the
    order their text arrives; usage (if asked) counts the prompt once."""
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(i: int, gen: Generation) -> None:
        try:
            async for delta in deadline.iterate(gen):
                queue.put_nowait((i, delta))
        except (ServiceError, ApiError) as exc:
            queue.put_nowait((i, exc))
            return
        queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, gen)) for i, gen in enumerate(gens)]
    streams = [ChoiceStream(fmt, i, tools, logprobs[i] if logprobs else None)
               for i in range(len(gens))]
    try:
        if fmt.chat:
            for i in range(len(gens)):
                yield sse_event(fmt.chunk("", role=True, index=i))
        running, failed = len(gens), None
        while running and failed is None:
            i, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, (ServiceError, ApiError)):
                failed = item
            else:
                for event in streams[i].events(item.text, item.finish_reason, item.logprobs):
                    yield event
        if failed is not None:
            error = ApiError.from_service(failed) if isinstance(failed, ServiceError) else failed
            yield sse_event(error.body())
        elif fmt.include_usage:
            yield sse_event(fmt.usage_chunk(choices_usage([g.final_usage() for g in gens], len(gens))))
        yield SSE_DONE
    finally:
        for task in tasks:
            task.cancel()
        close_all(gens)
