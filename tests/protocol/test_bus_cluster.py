"""The bus on a real 3-node NATS cluster: given the list, a client whose node dies (killed,
or silent with no TCP reset) fails over to another node within seconds and its requests
and subscriptions work there."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from libs.protocol import Bus, ServiceError
from libs.protocol.messages import Ping, Pong
from radixmesh.nats_cluster import NatsCluster

pytestmark = pytest.mark.slow


@pytest.fixture()
def cluster(tmp_path):
    with NatsCluster(3, log_dir=tmp_path) as c:
        yield c


async def _serve(bus: Bus, subject: str) -> None:
    async def pong(_: Ping) -> Pong:
        return Pong(service="s", instance=bus.name, uptime_s=0.0)

    await bus.subscribe(subject, pong, Ping)
    await bus.nc.flush()


async def _answered_within(client: Bus, subject: str, limit: float) -> float:
    """Seconds until a request on ``subject`` is answered again (fails past ``limit``)."""
    began = time.monotonic()
    while True:
        try:
            await client.request(subject, Ping(), Pong, timeout=1.0)
            return time.monotonic() - began
        except ServiceError:
            assert time.monotonic() - began < limit, f"no answer within {limit}s"
            await asyncio.sleep(0.05)


def _node_of(cluster: NatsCluster, bus: Bus):
    netloc = bus.broker()["nats_url"]
    return next(n for n in cluster.nodes if n.url.endswith(netloc))


async def test_a_client_follows_the_cluster_when_its_node_is_killed(cluster):
    responder = await Bus.connect(cluster.url, "responder")
    client = await Bus.connect(cluster.url, "client")
    try:
        await _serve(responder, "t.cluster.kill")
        await _answered_within(client, "t.cluster.kill", 10)
        info = client.broker()
        assert info["nats_cluster"] == "radixmesh" and info["nats_nodes"] == "3"
        victim = _node_of(cluster, client)
        victim.proc.kill()
        victim.proc.wait()
        took = await _answered_within(client, "t.cluster.kill", 10)
        assert took < 5, took
        assert _node_of(cluster, client) is not victim
    finally:
        await client.close()
        await responder.close()


async def test_a_silent_node_is_noticed_in_seconds_not_minutes(cluster):
    """SIGSTOP: the node's sockets stay open but nothing answers (a powered-off host)."""
    client = await Bus.connect(cluster.url, "client")
    victim = _node_of(cluster, client)
    # NOTE: the responder on the other nodes, so only the client's side goes silent
    responder = await Bus.connect([n.url for n in cluster.nodes if n is not victim], "responder")
    stopped = False
    try:
        await _serve(responder, "t.cluster.stop")
        await _answered_within(client, "t.cluster.stop", 10)
        os.kill(victim.proc.pid, signal.SIGSTOP)
        stopped = True
        limit = Bus.PING_S * (Bus.MAX_PINGS + 1) + 3
        took = await _answered_within(client, "t.cluster.stop", limit)
        assert _node_of(cluster, client) is not victim
        assert took < limit
    finally:
        if stopped:
            os.kill(victim.proc.pid, signal.SIGCONT)
        await client.close()
        await responder.close()
