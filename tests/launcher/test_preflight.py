"""radixmesh/preflight.py: a taken fixed port stops `radixmesh up` at once, with the flag to use."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from radixmesh.launcher import StackConfig
from radixmesh.preflight import Port, fixed_ports, taken_port

REPO = Path(__file__).resolve().parents[2]


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_fixed_ports_are_the_gateway_a_given_nats_port_and_metrics_ports():
    cfg = StackConfig(port=8123, nats_port=4333, extra={
        "scheduler": ["--metrics-port", "9100", "--metrics-host", "127.0.0.1"],
        "tokenizer": ["--metrics-port=9101"], "gateway": ["--metrics-port", "0"]})
    assert fixed_ports(cfg) == [Port("--port", "127.0.0.1", 8123),
                                Port("--nats-port", "127.0.0.1", 4333),
                                Port("--scheduler-metrics-port", "127.0.0.1", 9100),
                                Port("--tokenizer-metrics-port", "0.0.0.0", 9101)]
    # a free nats port is picked at start; an existing broker is not started at all
    assert [p.flag for p in fixed_ports(StackConfig(nats_port=0))] == ["--port"]
    assert [p.flag for p in fixed_ports(StackConfig(nats_port=4333, nats_url="nats://x:4222"))] == ["--port"]


def test_a_taken_port_is_named_with_its_flag_and_a_free_one_passes():
    with _listening() as sock:
        port = sock.getsockname()[1]
        problem = taken_port([Port("--port", "127.0.0.1", port)])
    assert problem is not None and "\n" not in problem
    assert f"port {port} on 127.0.0.1 is already in use" in problem and "--port" in problem
    assert taken_port([Port("--port", "127.0.0.1", port)]) is None  # free again
    bad_host = taken_port([Port("--port", "no-such-host.invalid", 8000)])
    assert bad_host is not None and bad_host.startswith("cannot listen on") and "--port" in bad_host


def test_radixmesh_up_on_a_taken_port_exits_at_once_with_the_flag(tmp_path):
    """The real CLI: no nats-server, no service, the last run's logs left in place."""
    (tmp_path / "gateway.log").write_text("the last run\n")
    with _listening() as sock:
        port = sock.getsockname()[1]
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "radixmesh.cli", "up", "--port", str(port),
                              "--log-dir", str(tmp_path)], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
        took = time.monotonic() - started
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last == (f"radixmesh: port {port} on 127.0.0.1 is already in use (another radixmesh up, "
                    f"or another server?): stop it, or pick another port with --port"), out.stderr
    assert "Traceback" not in out.stderr and took < 60  # the imports only: no crash loop
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gateway.log"]
    assert (tmp_path / "gateway.log").read_text() == "the last run\n"
