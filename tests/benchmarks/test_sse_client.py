"""The benchmarks' lean streaming client: chunked de-framing, events, errors, over a real socket."""

from __future__ import annotations

import asyncio
import json

import pytest

from radixmesh.benchmarks.sse_client import StreamError, _Chunks, stream_post


def _framed(payloads: list[bytes]) -> bytes:
    out = b""
    for p in payloads:
        out += b"%x\r\n" % len(p) + p + b"\r\n"
    return out + b"0\r\n\r\n"


EVENTS = [b'data: {"n": 1}\n\n', b'data: {"n": 2}\n\n', b"data: [DONE]\n\n"]


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_chunks_split_anywhere_give_the_same_events(step):
    raw = _framed(EVENTS)
    chunks = _Chunks()
    events = []
    for i in range(0, len(raw), step):
        events += chunks.feed(raw[i:i + step])
    assert events == [b'data: {"n": 1}', b'data: {"n": 2}', b"data: [DONE]"]
    assert chunks.ended


def test_an_event_split_over_two_chunks_is_one_event():
    chunks = _Chunks()
    assert chunks.feed(_framed([b'data: {"n"', b': 1}\n\n'])) == [b'data: {"n": 1}']


def test_a_bad_chunk_size_line_is_an_error():
    with pytest.raises(StreamError, match="chunk size"):
        _Chunks().feed(b"zz\r\nhello\r\n")


async def _serve(reply: bytes, seen: list[bytes]):
    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        seen.append(head + await reader.readexactly(length))
        for i in range(0, len(reply), 5):  # NOTE: in pieces, as a stream arrives
            writer.write(reply[i:i + 5])
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _run(reply: bytes):
    seen: list[bytes] = []

    async def go():
        server = await _serve(reply, seen)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await stream_post(f"http://127.0.0.1:{port}", "/generate", {"input_ids": [1, 2]})

    return asyncio.run(go()), seen


def test_stream_post_reads_the_last_event_and_its_times():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    times, seen = _run(head + _framed(EVENTS))
    assert json.loads(times.last_event) == {"n": 2}
    assert 0 < times.first <= times.last
    request = seen[0]
    assert request.startswith(b"POST /generate HTTP/1.1\r\n")
    assert json.loads(request.split(b"\r\n\r\n", 1)[1]) == {"input_ids": [1, 2]}


def test_an_error_status_raises_with_the_body():
    body = b'{"error": {"message": "bad"}}'
    head = b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(body)
    with pytest.raises(StreamError, match="HTTP 400.*bad"):
        _run(head + body)


def test_a_stream_cut_short_is_an_error():
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    with pytest.raises(StreamError, match="closed before the end"):
        _run(head + _framed(EVENTS[:1])[:-5])  # NOTE: no terminating chunk


def test_a_stream_without_events_is_an_error():
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    with pytest.raises(StreamError, match="no events"):
        _run(head + _framed([b"data: [DONE]\n\n"]))


def _drain(reply: bytes):
    from radixmesh.benchmarks.sse_client import drain_post

    seen: list[bytes] = []

    async def go():
        server = await _serve(reply, seen)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await drain_post(f"http://127.0.0.1:{port}", "/v1/completions", {"prompt": [1]})

    return asyncio.run(go()), seen


def test_drain_post_reads_to_the_end_and_counts_the_body():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = _framed(EVENTS)
    got, seen = _drain(head + body)
    assert got.nbytes == len(body) and 0 < got.first <= got.end
    assert b"connection: close" in seen[0]


def test_drain_post_raises_on_an_error_status():
    body = b'{"error": {"message": "bad"}}'
    with pytest.raises(StreamError, match="HTTP 400.*bad"):
        _drain(b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
