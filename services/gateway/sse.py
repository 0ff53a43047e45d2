"""Server-sent events, and running work only while the HTTP client is still there."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import msgspec
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

SSE_DONE = b"data: [DONE]\n\n"
_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_encoder = msgspec.json.Encoder()


def sse_event(obj: Any) -> bytes:
    """One ``data: <json>`` event."""
    return b"data: " + _encoder.encode(obj) + b"\n\n"


def json_string(text: str) -> bytes:
    """``text`` as a JSON string."""
    return _encoder.encode(text)


def parse_sse(body: bytes) -> list[Any]:
    """Decode a whole SSE body into its JSON payloads; ``[DONE]`` becomes the string."""
    out: list[Any] = []
    for block in body.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[len(b"data: "):]
            out.append("[DONE]" if data == b"[DONE]" else msgspec.json.decode(data))
    return out


RAW_SEND = "radixmesh.send"  # scope key: the server's own send, under every middleware (app.py)


def chunk_writer(send: Send | None) -> Callable[[bytes], bool] | None:
    """A synchronous writer of response body chunks straight to the connection, or None
    where the server is not uvicorn's httptools protocol on a chunked response (then
    every chunk goes through ``send``). The writer returns False, writing nothing, when
    the connection is gone or paused for a slow reader, so the caller's ``send`` (which
    waits) takes the chunk instead.

    NOTE: a chunk written here is the bytes uvicorn's own send writes for it
    (``<size hex>\r\n<body>\r\n``); only body chunks of a started response go this
    way, its start and end always through ``send``, so uvicorn's state stays its own.
    """
    cycle = getattr(send, "__self__", None)
    try:
        from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
    except ImportError:  # pragma: no cover - httptools is a dependency
        return None
    if not isinstance(cycle, RequestResponseCycle) or cycle.chunked_encoding is not True:
        return None
    transport, flow = cycle.transport, cycle.flow

    def write(body: bytes) -> bool:
        if cycle.disconnected or flow.write_paused or cycle.response_complete:
            return False
        transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True

    return write


class ClientGone(Exception):
    """The HTTP client disconnected before the work finished."""


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def run_until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await ``work``; cancel it and raise ClientGone if the client disconnects first.

    Call it after the request body has been read: any later message on
    ``receive`` is the disconnect.
    """
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            # NOTE: let the work's own cleanup (abort, release) run to completion
            await asyncio.wait((task,))
    if task.cancelled() and watch.done() and not watch.cancelled():
        raise ClientGone()
    return task.result()


class SSEResponse:
    """Stream ``events`` as SSE; stop (and call ``on_close``) when the client leaves.

    ``on_close`` runs exactly once whatever happens, even if the stream never
    started, so the request behind it is always cleaned up.
    """

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None] | None = None,
                 status_code: int = 200, headers: dict[str, str] | None = None,
                 on_stream: Callable[[Callable[[bytes], bool]], None] | None = None) -> None:
        self.events = events
        self.on_close = on_close
        # given the connection's chunk writer once the response started (see chunk_writer)
        self.on_stream = on_stream
        self._raw_send: Send | None = None
        self.status_code = status_code
        self.headers = _HEADERS + [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._raw_send = scope.get(RAW_SEND)
        try:
            await run_until_disconnect(receive, self._stream(send))
        except (ClientGone, OSError):
            pass
        finally:
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                await aclose()
            if self.on_close is not None:
                self.on_close()

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.headers})
        if self.on_stream is not None:
            write = chunk_writer(self._raw_send)
            if write is not None:
                self.on_stream(write)
        async for chunk in self.events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
