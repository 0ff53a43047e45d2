"""What ``radixmesh up`` checks before it starts anything: every fixed port it will bind
is free. A taken gateway port used to surface as the gateway's crash loop (five restarts
over 18 s, then a raw ``OSError: [Errno 98]``); now it is one line naming the flag."""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Port:
    """A port a process of the stack will listen on, and the flag that sets it."""

    flag: str
    host: str
    port: int


def fixed_ports(cfg) -> list[Port]:
    """The ports of ``cfg`` (a StackConfig) that are not picked free at start: the gateway's,
    the nats-server's when given, and every service's ``--metrics-port``."""
    ports = [Port("--port", cfg.host, cfg.port)]
    if not cfg.nats_url and cfg.nats_port:
        ports.append(Port("--nats-port", cfg.nats_host, cfg.nats_port))
    for service, argv in cfg.extra.items():
        port = _flag_value(argv, "--metrics-port")
        if port and int(port) > 0:
            flag = f"--{service.replace('_', '-')}-metrics-port"
            ports.append(Port(flag, _flag_value(argv, "--metrics-host") or "0.0.0.0", int(port)))
    return ports


def taken_port(ports: list[Port]) -> str | None:
    """Why the first port that cannot be bound is not free (one line), or None."""
    for p in ports:
        problem = _bind_error(p.host, p.port)
        if problem is None:
            continue
        if problem.errno == errno.EADDRINUSE:
            return (f"port {p.port} on {p.host} is already in use (another radixmesh up, or "
                    f"another server?): stop it, or pick another port with {p.flag}")
        return f"cannot listen on {p.host}:{p.port} ({problem.strerror or problem}): check {p.flag}"
    return None


def _bind_error(host: str, port: int) -> OSError | None:
    """Bind as the servers do (SO_REUSEADDR: a port in TIME_WAIT is free), then let go."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
    except OSError as exc:  # NOTE: socket.gaierror too: a host that does not resolve
        return exc
    return None


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value after the last ``flag`` in ``argv`` (or of ``flag=value``)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value
