"""A broker restart: requests fail fast with 503 while it is away, subscriptions
come back by themselves, and concurrent handlers are bounded."""

from __future__ import annotations

import asyncio
import time

import pytest

from libs.protocol import Bus, ServiceError
from libs.protocol.messages import Ping, Pong
from radixmesh.natsd import NatsServer, free_port


async def wait_connected(bus: Bus, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not bus.nc.is_connected:
        assert time.monotonic() < deadline, "no reconnect"
        await asyncio.sleep(0.05)


async def ping_until_answered(client: Bus, timeout: float = 10.0) -> None:
    """NOTE: a fresh nats-server sometimes answers "no responders" to the first
    request just after another connection subscribed and flushed (about 1 in 15
    here; 50 ms later it routes), so readiness is polled, not assumed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            assert (await client.request("t.ping", Ping(), Pong, timeout=1.0)).service == "s"
            return
        except ServiceError:
            assert time.monotonic() < deadline, "the responder never answered"
            await asyncio.sleep(0.05)


async def test_requests_fail_fast_during_an_outage_and_work_after_it(tmp_path):
    server = NatsServer(log_file=tmp_path / "nats.log").start()
    server_bus = await Bus.connect(server.url, "responder")
    client = await Bus.connect(server.url, "client")
    try:
        async def pong(_: Ping) -> Pong:
            return Pong(service="s", instance="i", uptime_s=0.0)

        await server_bus.subscribe("t.ping", pong, Ping)
        await server_bus.nc.flush()
        await ping_until_answered(client)

        server.proc.kill()
        server.proc.wait()
        deadline = time.monotonic() + 10
        while client.nc.is_connected:  # NOTE: wait for the client to notice, not a fixed sleep
            assert time.monotonic() < deadline, "the closed socket went unnoticed"
            await asyncio.sleep(0.02)
        began = time.monotonic()
        with pytest.raises(ServiceError) as err:
            await client.request("t.ping", Ping(), Pong, timeout=5.0)
        assert (err.value.code, err.value.status) == ("broker_unavailable", 503)
        assert time.monotonic() - began < 0.5

        server.start()  # the same port
        await wait_connected(client)
        await wait_connected(server_bus)
        await ping_until_answered(client)  # the responder's subscription came back by itself
    finally:
        await client.close()
        await server_bus.close()
        server.stop()


async def test_no_responders_just_after_a_reconnect_is_retried_not_a_503(tmp_path):
    """After a broker restart the other services resubscribe at their own pace: a request
    sent before its responder is back waits for it (within RESUBSCRIBE_S and the request's
    timeout) instead of failing with "no responders"; otherwise that fails at once."""
    server = NatsServer(log_file=tmp_path / "nats.log").start()
    client = await Bus.connect(server.url, "client")
    responder = None
    try:
        began = time.monotonic()
        with pytest.raises(ServiceError) as err:  # never reconnected: no responders is final
            await client.request("t.late", Ping(), Pong, timeout=5.0)
        assert err.value.code == "service_unavailable" and time.monotonic() - began < 0.5
        server.proc.kill()
        server.proc.wait()
        deadline = time.monotonic() + 10
        while client.nc.is_connected:  # NOTE: a request sent before the client notices is lost
            assert time.monotonic() < deadline, "the closed socket went unnoticed"
            await asyncio.sleep(0.02)
        server.start()  # the same port
        await wait_connected(client)

        async def late_responder() -> Bus:
            await asyncio.sleep(0.6)  # as a service whose reconnect attempt comes later
            bus = await Bus.connect(server.url, "responder")

            async def pong(_: Ping) -> Pong:
                return Pong(service="late", instance="i", uptime_s=0.0)

            await bus.subscribe("t.late", pong, Ping)
            await bus.nc.flush()
            return bus

        joining = asyncio.create_task(late_responder())
        reply = await client.request("t.late", Ping(), Pong, timeout=5.0)
        responder = await joining
        assert reply.service == "late"
        await asyncio.sleep(Bus.RESUBSCRIBE_S)  # long after the reconnect: final again
        began = time.monotonic()
        with pytest.raises(ServiceError) as err:
            await client.request("t.nobody", Ping(), Pong, timeout=5.0)
        assert err.value.code == "service_unavailable" and time.monotonic() - began < 0.5
    finally:
        for bus in (client, responder):
            if bus is not None:
                await bus.close()
        server.stop()


async def test_concurrent_handlers_are_bounded(nats_server, subject_prefix, monkeypatch):
    monkeypatch.setattr(Bus, "MAX_CONCURRENT", 3)
    bus = await Bus.connect(nats_server.url, "bounded")
    release = asyncio.Event()
    running, peak = 0, 0

    async def slow(_: Ping) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    try:
        subject = f"{subject_prefix}.slow"
        await bus.subscribe(subject, slow, Ping, concurrent=True)
        for _ in range(10):
            await bus.publish(subject, Ping())
        await bus.nc.flush()
        await asyncio.sleep(0.3)
        assert peak == 3 and running == 3  # the other 7 wait in the subscription
        release.set()
        await asyncio.sleep(0.3)
        assert running == 0 and peak == 3
    finally:
        await bus.close()


async def test_a_connect_given_up_stops_retrying():
    """A caller's deadline (the worker's store URL with no server) ends the attempt:
    no connect keeps retrying, and logging, in the background."""
    url = f"nats://127.0.0.1:{free_port()}"
    before = asyncio.all_tasks()  # NOTE: the loop is the session's: earlier tests' tasks are not ours
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(Bus.connect(url, "gives-up"), 1.0)
    await asyncio.sleep(0.7)  # NOTE: longer than the reconnect wait (0.5 s)
    left = [t for t in asyncio.all_tasks() - before if not t.done()]
    assert not left, [t.get_coro() for t in left]
