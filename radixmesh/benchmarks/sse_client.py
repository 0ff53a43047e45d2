"""A lean streaming HTTP/1.1 client for benchmarks that share the machine with the server.

A benchmark's client on the server's own cores takes CPU from what it measures: httpx
(h11 and anyio in Python) spent ~100 us per streamed event on 2 cores, about as much as
the gateway that produced it. This client does what a decode benchmark needs and no more:
one connection per request, the request written in one piece, the chunked body
de-framed as it arrives, each data event's arrival time and bytes kept, parsed by the
caller after the run (a /generate stream's events are cumulative). Any status but 200
raises with the body.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

DONE = b"data: [DONE]"


class StreamError(RuntimeError):
    """The server answered with an error, or broke the HTTP framing."""


@dataclass
class StreamTimes:
    first: float  # perf_counter() when the first event arrived
    events: list[tuple[float, bytes]]  # every data event's arrival time and payload, in order (never empty)

    @property
    def last(self) -> float:
        """When the last data event before [DONE] arrived."""
        return self.events[-1][0]

    @property
    def last_event(self) -> bytes:
        """That event's payload (after "data: ")."""
        return self.events[-1][1]


class _Chunks:
    """Incremental de-framing of a chunked body into SSE events."""

    def __init__(self) -> None:
        self.raw = bytearray()  # framed bytes not yet de-framed
        self.body = bytearray()  # de-framed bytes not yet split into events
        self.ended = False

    def feed(self, data: bytes) -> list[bytes]:
        """The whole events ``data`` completes (without their ``\\n\\n``)."""
        self.raw += data
        while not self.ended:
            eol = self.raw.find(b"\r\n")
            if eol < 0:
                break
            try:
                size = int(bytes(self.raw[:eol]).split(b";", 1)[0], 16)
            except ValueError:
                raise StreamError(f"bad chunk size line {bytes(self.raw[:eol][:40])!r}") from None
            end = eol + 2 + size
            if len(self.raw) < end + 2:
                break
            self.body += self.raw[eol + 2:end]
            del self.raw[:end + 2]
            self.ended = size == 0
        *events, rest = bytes(self.body).split(b"\n\n")
        self.body = bytearray(rest)
        return events


async def stream_post(url: str, path: str, body: dict, timeout: float = 600.0) -> StreamTimes:
    """POST ``body`` as JSON to ``url + path`` and read its SSE stream to the end."""
    return await _post(url, path, body, _read_stream, timeout, "accept: text/event-stream\r\n")


async def _post(url: str, path: str, body: dict, read, timeout: float, extra_headers: str = ""):
    """POST ``body`` as JSON (``connection: close``) and return ``read(reader)``'s result."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"{extra_headers}content-length: {len(payload)}\r\nconnection: close\r\n\r\n")
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head.encode() + payload)
        return await asyncio.wait_for(read(reader), timeout)
    finally:
        writer.close()


async def _read_stream(reader: asyncio.StreamReader) -> StreamTimes:
    status, headers = await _read_head(reader)
    if status != 200 or headers.get(b"transfer-encoding") != b"chunked":
        rest = await reader.read()
        raise StreamError(f"HTTP {status}: {rest[:300]!r}")
    chunks = _Chunks()
    first = 0.0
    events: list[tuple[float, bytes]] = []
    while not chunks.ended:
        data = await reader.read(1 << 16)
        if not data:
            raise StreamError("connection closed before the end of the stream")
        now = time.perf_counter()
        for event in chunks.feed(data):
            first = first or now
            if event.startswith(b"data: ") and event != DONE:
                events.append((now, event[6:]))
    if not events:
        raise StreamError("no events in the stream")
    return StreamTimes(first, events)


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    try:
        status = int(lines[0].split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise StreamError(f"bad status line {lines[0][:80]!r}") from None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower()] = value.strip().lower()
    return status, headers


@dataclass
class Drained:
    first: float  # perf_counter() when the first bytes of the body arrived
    end: float  # when the server closed the connection (the stream's end)
    nbytes: int  # the body's bytes, framing included


async def drain_post(url: str, path: str, body: dict, timeout: float = 600.0) -> Drained:
    """POST ``body`` and read the streamed answer to its end without parsing it: the
    leanest client there is (one ``read`` per arrival, no de-framing), for benchmarks
    that count the server's CPU and take the tokens from its own counters. The request
    asks ``connection: close``, so the end of the body is the end of the connection."""
    return await _post(url, path, body, _drain, timeout)


async def _drain(reader: asyncio.StreamReader) -> Drained:
    status, _ = await _read_head(reader)
    first = time.perf_counter()
    if status != 200:
        rest = await reader.read()
        raise StreamError(f"HTTP {status}: {rest[:300]!r}")
    nbytes = 0
    while data := await reader.read(1 << 16):
        nbytes += len(data)
    return Drained(first, time.perf_counter(), nbytes)
