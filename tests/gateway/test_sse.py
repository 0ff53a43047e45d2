"""SSE formatting and the disconnect watcher, driven through plain ASGI callables."""

from __future__ import annotations

import asyncio

import pytest

from services.gateway.sse import SSE_DONE, ClientGone, SSEResponse, parse_sse, run_until_disconnect, sse_event


def test_event_format_and_parse():
    event = sse_event({"a": "ü\n", "b": [1]})
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n")
    assert b"\n" not in event[:-2]  # the newline in the value is escaped
    assert parse_sse(event + sse_event(None) + SSE_DONE) == [{"a": "ü\n", "b": [1]}, None, "[DONE]"]


class Client:
    """The ASGI receive side of a client that can hang up."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)


async def test_work_finishes_first():
    client = Client()

    async def work() -> int:
        await asyncio.sleep(0.01)
        return 42

    assert await run_until_disconnect(client.receive, work()) == 42


async def test_disconnect_cancels_work_and_waits_for_its_cleanup():
    client = Client()
    cleaned = []

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0.01)  # cleanup that itself awaits
            cleaned.append(True)

    asyncio.get_running_loop().call_later(0.05, client.gone.set)
    with pytest.raises(ClientGone):
        await run_until_disconnect(client.receive, work())
    assert cleaned == [True]


async def test_work_errors_propagate():
    client = Client()

    async def work() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError):
        await run_until_disconnect(client.receive, work())


async def test_sse_response_streams_and_closes_once():
    client = Client()
    closed = []

    async def events():
        yield sse_event({"n": 1})
        yield SSE_DONE

    await SSEResponse(events(), on_close=lambda: closed.append(1))({}, client.receive, client.send)
    assert client.sent[0]["type"] == "http.response.start" and client.sent[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in client.sent[1:])
    assert parse_sse(body) == [{"n": 1}, "[DONE]"] and closed == [1]
    assert client.sent[-1]["more_body"] is False


async def test_sse_response_closes_when_send_fails_before_streaming():
    closed = []
    started = []

    async def events():
        started.append(True)
        yield SSE_DONE

    async def broken_send(message: dict) -> None:
        raise OSError("connection reset")

    await SSEResponse(events(), on_close=lambda: closed.append(1))({}, Client().receive, broken_send)
    assert closed == [1] and started == []


async def test_sse_response_stops_generator_on_disconnect():
    client = Client()
    finalized = []

    async def events():
        try:
            yield sse_event({"n": 1})
            await asyncio.sleep(10)
            yield SSE_DONE
        finally:
            finalized.append(True)

    asyncio.get_running_loop().call_later(0.05, client.gone.set)
    await asyncio.wait_for(SSEResponse(events())({}, client.receive, client.send), 2)
    assert finalized == [True]
