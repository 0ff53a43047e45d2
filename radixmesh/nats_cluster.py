"""A NATS cluster of local ``nats-server`` nodes (``radixmesh up --nats-cluster N``, tests).

Each node listens for clients on its own port and for routes on another, names every
other node as a route, and keeps its JetStream files in a folder of its own; the nodes
find each other in about a second. What the services are given is the comma-separated
list of the nodes' client URLs (:attr:`url`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import json
import urllib.request

from .natsd import NatsServer, Routes, free_ports

CLUSTER_NAME = "radixmesh"


class NatsCluster:
    def __init__(self, size: int = 3, log_dir: str | os.PathLike | None = None,
                 jetstream_dir: str | os.PathLike | None = None, host: str = "127.0.0.1",
                 ports: list[int] | None = None, name: str = CLUSTER_NAME) -> None:
        if size < 1:
            raise ValueError("a NATS cluster needs at least one node")
        picked = free_ports(3 * size)  # client, route and monitoring ports, all distinct
        ports = ports or picked[:size]
        route_ports = picked[size:2 * size]
        monitor_ports = picked[2 * size:]
        route_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        routes = tuple(f"nats://{route_host}:{p}" for p in route_ports)
        self.nodes = [
            NatsServer(
                port=ports[i], host=host, server_name=f"n{i + 1}",
                log_file=Path(log_dir) / f"nats-server-n{i + 1}.log" if log_dir else None,
                jetstream_dir=Path(jetstream_dir) / f"n{i + 1}" if jetstream_dir else None,
                cluster=Routes(name, route_ports[i], tuple(r for j, r in enumerate(routes) if j != i))
                if size > 1 else None,
                monitor_port=monitor_ports[i] if size > 1 else None,
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def start(self, timeout: float = 10.0) -> "NatsCluster":
        try:
            for node in self.nodes:
                node.start()
            self.wait_routed(timeout)
            if any(n.jetstream_dir is not None for n in self.nodes):
                self.wait_jetstream(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_routed(self, timeout: float = 10.0) -> None:
        """Until every running node has a route to every other running node."""
        deadline = time.monotonic() + timeout
        while True:
            live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
            if len(live) <= 1 or all(_routes(n) >= len(live) - 1 for n in live):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"NATS cluster routes not formed within {timeout}s")
            time.sleep(0.1)

    def wait_jetstream(self, timeout: float = 10.0) -> None:
        """Until JetStream's meta group has a leader that counts every running node current.

        NOTE: a stream asked for before then may be refused its replicas ("no suitable peers
        for placement") and keep one copy, which a lost node then takes with it."""
        deadline = time.monotonic() + timeout
        while True:
            live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
            if len(live) <= 1 or any(_meta_current(n) >= len(live) for n in live):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"NATS cluster's JetStream not ready within {timeout}s")
            time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> "NatsCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _routes(node: NatsServer) -> int:
    """How many other nodes ``node`` has routes to now (route pools count once)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.monitor_port}/routez", timeout=1) as resp:
            routez = json.load(resp)
    except (OSError, ValueError):
        return 0
    return len({r.get("remote_name") or r.get("remote_id") for r in routez.get("routes") or ()})


def _meta_current(node: NatsServer) -> int:
    """How many nodes JetStream's meta group counts current, asked of ``node``; 0 unless it
    is the meta leader (only the leader's view of its followers is authoritative)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.monitor_port}/jsz", timeout=1) as resp:
            meta = json.load(resp).get("meta_cluster") or {}
    except (OSError, ValueError):
        return 0
    if not meta.get("leader") or meta.get("leader") != node.server_name:
        return 0
    followers = [r for r in meta.get("replicas") or () if r.get("current") and not r.get("offline")]
    return 1 + len(followers)
