"""Per-gateway limits with clear answers: concurrency, max_tokens, prompt size, deadlines.

=========================  =====  ==================================================
limit                      HTTP   where
=========================  =====  ==================================================
--max-body-bytes           413    routes.read_body
--max-concurrent-requests  429    :class:`ConcurrencyLimit` (``Retry-After``)
--max-tokens-cap           400    :meth:`Limits.cap_max_tokens` (a missing max -> cap)
--max-prompt-tokens        400    :meth:`Limits.check_prompt` (ids: before submit;
                                  text: after encoding, the request is aborted)
``timeout``                408    :class:`Deadline` (submit + whole generation;
--request-deadline         504    a stream ends with an error event instead)
=========================  =====  ==================================================
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import AsyncIterator, TypeVar

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import ApiError

T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    """0 / None disables a limit."""

    max_tokens_cap: int = 0
    max_prompt_tokens: int = 0
    max_concurrent_requests: int = 0
    request_deadline: float | None = None  # default deadline (s) when a body gives none

    def cap_max_tokens(self, explicit: int | None, param: str,
                       default: int | None = None) -> int | None:
        """The completion budget: ``explicit`` (400 above the cap), else ``default``
        clamped to the cap (the cap itself when there is no default)."""
        cap = self.max_tokens_cap
        if explicit is None:
            if not cap:
                return default
            return cap if default is None else min(default, cap)
        if cap and explicit > cap:
            raise ApiError(400, f"{param} must be at most {cap} on this server, got {explicit}",
                           param, "max_tokens_exceeded")
        return explicit

    def check_prompt(self, prompt_tokens: int) -> None:
        limit = self.max_prompt_tokens
        if limit and prompt_tokens > limit:
            raise ApiError(400, f"the prompt has {prompt_tokens} tokens; this server accepts at "
                           f"most {limit}", "prompt", "prompt_too_long")

    def deadline(self, requested: float | None) -> "Deadline":
        """The request's own ``timeout`` (408 past it), never beyond the server's
        deadline (504 past it)."""
        server = self.request_deadline
        if requested is None or (server is not None and server < requested):
            return Deadline(server)
        return Deadline(requested, by_client=True)


class Deadline:
    """A point in time past which a request is abandoned (None: never)."""

    def __init__(self, seconds: float | None, by_client: bool = False) -> None:
        self.seconds = seconds
        self.by_client = by_client  # the body's ``timeout`` set it
        self.at = None if seconds is None else time.monotonic() + seconds

    def error(self) -> ApiError:
        """408 when the client's own ``timeout`` passed, 504 for the server's deadline."""
        if self.by_client:
            return ApiError(408, f"the request did not finish within its timeout of "
                            f"{self.seconds:g}s", "timeout", "timeout")
        return ApiError(504, f"the request did not finish within this server's deadline of "
                        f"{self.seconds:g}s", None, "timeout")

    def _loop_deadline(self) -> float | None:
        if self.at is None:
            return None
        return asyncio.get_running_loop().time() + (self.at - time.monotonic())

    async def run(self, work) -> T:
        """Await ``work`` (a coroutine); 504 :class:`ApiError` once the deadline passes."""
        try:
            async with asyncio.timeout_at(self._loop_deadline()):
                return await work
        except TimeoutError:
            raise self.error() from None

    def iterate(self, items: AsyncIterator[T]) -> AsyncIterator[T]:
        """``items`` until the deadline; then 504 :class:`ApiError`. Without a deadline,
        ``items`` themselves: no timer and no generator between them and the consumer,
        per streamed event."""
        return items if self.at is None else self._until(items)

    async def _until(self, items: AsyncIterator[T]) -> AsyncIterator[T]:
        """NOTE: the timeout covers only the wait for the next item, never a
        ``yield``: a cancellation must not land in the consumer's code."""
        it = aiter(items)
        while True:
            try:
                async with asyncio.timeout_at(self._loop_deadline()):
                    item = await anext(it)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise self.error() from None
            yield item


NO_DEADLINE = Deadline(None)


class ConcurrencyLimit:
    """429 with ``Retry-After`` once ``limit`` requests on ``paths`` are in flight.

    A streamed response counts until its last byte is sent (or its client leaves).
    """

    def __init__(self, app: ASGIApp, limit: int, paths: frozenset[str],
                 retry_after: int = 1) -> None:
        self.app = app
        self.limit = limit
        self.paths = paths
        self.retry_after = retry_after
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            error = ApiError(429, f"too many concurrent requests on this gateway (limit "
                             f"{self.limit}); retry later", code="rate_limit_exceeded")
            await error.response(self.retry_after)(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
