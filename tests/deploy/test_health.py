"""radixmesh.health: the container health check finds its own instance among replicas."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from libs.protocol.bus import Bus
from libs.protocol.messages import Ping, Pong
from libs.protocol.subjects import Subjects
from radixmesh import health


async def _replicas(bus: Bus, subject: str, instances: list[str]) -> None:
    """Answer pings like run_service does, once per replica."""
    for instance in instances:
        async def on_ping(_: Ping, instance=instance) -> Pong:
            return Pong(service="scheduler", instance=instance, uptime_s=1.0)

        await bus.subscribe(subject, on_ping, Ping)


async def test_waits_for_its_own_instance(nats_server, subject_prefix):
    subject = Subjects(subject_prefix).ping("scheduler")
    bus = await Bus.connect(nats_server.url, "replicas")
    try:
        await _replicas(bus, subject, ["scheduler-aaa", "scheduler-bbb", "scheduler-ccc"])
        status = await health.check_ping(nats_server.url, subject, "scheduler-ccc", timeout=3.0)
        assert status.startswith("scheduler scheduler-ccc up")
        assert (await health.check_ping(nats_server.url, subject, None, 3.0)).startswith("scheduler scheduler-")
        with pytest.raises(health.Unhealthy, match="no pong from scheduler-zzz"):
            await health.check_ping(nats_server.url, subject, "scheduler-zzz", timeout=0.5)
    finally:
        await bus.close()


async def test_an_instance_still_loading_its_state_is_not_healthy(nats_server, subject_prefix):
    """A cache index replica answers pings before it joins the route queue group."""
    subject = Subjects(subject_prefix).ping("cache_index")
    bus = await Bus.connect(nats_server.url, "replicas")
    try:
        for instance, ready in (("ci-new", "false"), ("ci-old", "true")):
            async def on_ping(_: Ping, instance=instance, ready=ready) -> Pong:
                return Pong(service="cache_index", instance=instance, uptime_s=1.0,
                            detail={"ready": ready})

            await bus.subscribe(subject, on_ping, Ping)
        with pytest.raises(health.Unhealthy, match="ci-new is up but not ready"):
            await health.check_ping(nats_server.url, subject, "ci-new", timeout=3.0)
        assert (await health.check_ping(nats_server.url, subject, None, 3.0)).startswith("cache_index ci-old")
    finally:
        await bus.close()


async def test_unreachable_broker_is_unhealthy():
    with pytest.raises(health.Unhealthy, match="cannot connect to NATS"):
        await health.check_ping("nats://127.0.0.1:9", "rm.ping.scheduler", None, timeout=0.5)


def test_main_exit_codes(nats_server, subject_prefix, capsys):
    argv = ["cache_index", "--nats-url", nats_server.url, "--subject-prefix", subject_prefix,
            "--instance", "nobody", "--timeout", "0.3"]
    assert health.main(argv) == 1
    assert "unhealthy: no pong from nobody" in capsys.readouterr().err


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802
        body = b'{"status":"ok"}' if self.status == 200 else b'{"detail":"workers: none"}'
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("status", [200, 503])
def test_gateway_is_checked_over_http(status):
    handler = type("H", (_Health,), {"status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/health"
    try:
        args = health.parse_args(["gateway", "--url", url, "--timeout", "2"])
        if status == 200:
            assert health.check(args) == f"{url}: 200"
        else:
            with pytest.raises(health.Unhealthy, match="503 .*workers: none"):
                health.check(args)
    finally:
        server.shutdown()
        server.server_close()


def test_service_from_pid1(tmp_path: Path):
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"/opt/venv/bin/python\0-m\0services.gpu_worker\0--kv-slots\0008\0")
    assert health.service_of_pid1(cmdline) == "gpu_worker"
    cmdline.write_bytes(b"nats-server\0--config\0/etc/nats.conf\0")
    with pytest.raises(health.Unhealthy, match="PID 1"):
        health.service_of_pid1(cmdline)


def test_instance_is_a_subject_token(monkeypatch):
    monkeypatch.delenv("RADIXMESH_INSTANCE", raising=False)
    monkeypatch.setenv("HOSTNAME", "node-1.cluster.local")
    assert health.container_instance("tokenizer") == "tokenizer-node-1-cluster-local"
    monkeypatch.setenv("RADIXMESH_INSTANCE", "tok-7")
    assert health.container_instance("tokenizer") == "tok-7"
