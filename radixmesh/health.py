"""``python -m radixmesh.health [service]``: exit 0 when this container's service is up.

A container health check. Every service answers a NATS ping on
``<prefix>.ping.<service>``, and *every* instance of a service answers it, so the
check waits for the reply of this container's own instance: ``--instance``,
default ``RADIXMESH_INSTANCE`` or ``<service>-<hostname>``, the id the container
entrypoint (docker/entrypoint.sh) gives the service. The gateway is checked
over HTTP instead (``GET /health``: 200 once a tokenizer and a worker are reachable).
An instance whose Pong says ``ready: "false"`` (a cache index still loading the
workers' state) is up but not healthy yet.

Without a service argument the service is read from PID 1's command line
(``python -m services.<name>``). Exit codes: 0 healthy, 1 not (reason on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

SERVICES = ("cache_index", "gateway", "gpu_worker", "scheduler", "tokenizer")
_NOT_TOKEN = re.compile(r"[^A-Za-z0-9_\-]")


class Unhealthy(Exception):
    """The service did not answer as expected; the message says why."""


def container_instance(service: str) -> str:
    """The instance id the entrypoint gives ``service``: a valid subject token."""
    host = os.environ.get("HOSTNAME") or socket.gethostname()
    return os.environ.get("RADIXMESH_INSTANCE") or f"{service}-{_NOT_TOKEN.sub('-', host)}"


def service_of_pid1(cmdline: Path = Path("/proc/1/cmdline")) -> str:
    """The service PID 1 runs (``python -m services.<name>``), or raise Unhealthy."""
    try:
        args = cmdline.read_bytes().split(b"\0")
    except OSError as exc:
        raise Unhealthy(f"cannot read {cmdline}: {exc}") from None
    for arg in args:
        name = arg.decode(errors="replace").removeprefix("services.")
        if arg.startswith(b"services.") and name in SERVICES:
            return name
    raise Unhealthy("no service given and PID 1 is not python -m services.<name>")


def check_http(url: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return f"{url}: {resp.status}"
    except urllib.error.HTTPError as err:
        raise Unhealthy(f"{url}: {err.code} {err.read()[:300].decode(errors='replace')}") from None
    except OSError as exc:
        raise Unhealthy(f"{url}: {exc}") from None


async def check_ping(nats_url: str, subject: str, instance: str | None, timeout: float) -> str:
    """Publish one Ping and wait for a Pong from ``instance`` (None: from anyone)."""
    import nats

    from libs.protocol import codec
    from libs.protocol.credentials import NatsCredentials
    from libs.protocol.messages import Ping, Pong
    from libs.protocol.servers import ServerListError, parse_servers

    async def quiet(_: Exception) -> None:
        pass

    try:
        servers = parse_servers(nats_url)
        options = NatsCredentials.from_env().with_url_auth(
            servers.user, servers.password, servers.token).connect_options()
    except (ServerListError, ValueError, FileNotFoundError) as exc:
        raise Unhealthy(f"bad NATS settings: {exc}") from None
    nc, why = None, ""
    for url in servers.urls:  # NOTE: any node of the cluster will do: one try each
        try:
            nc = await asyncio.wait_for(nats.connect(
                url, name="healthcheck", connect_timeout=timeout, allow_reconnect=False,
                max_reconnect_attempts=0, error_cb=quiet, **options,
            ), timeout)
            break
        except Exception as exc:  # noqa: BLE001 - any connect failure: the next server
            why += f"; {url}: " + (f"no connection within {timeout:.1f}s"
                                   if isinstance(exc, asyncio.TimeoutError) else repr(exc))
    if nc is None:
        raise Unhealthy(f"cannot connect to NATS ({why[2:]})")
    found: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    loading: list[str] = []  # instances up but not ready yet (Pong detail ready "false")

    async def on_reply(msg) -> None:
        try:
            pong = codec.decode(msg.data, Pong)
        except Exception:  # noqa: BLE001 - an error reply or junk: keep waiting
            return
        if (instance is not None and pong.instance != instance) or found.done():
            return
        if pong.detail.get("ready") == "false":  # NOTE: e.g. a cache index loading its state
            loading.append(pong.instance)
            if instance is not None:  # its own instance answered: no need to wait further
                found.set_exception(_not_ready(pong.instance))
        else:
            found.set_result(f"{pong.service} {pong.instance} up {pong.uptime_s:.0f}s")

    try:
        inbox = nc.new_inbox()
        await nc.subscribe(inbox, cb=on_reply)
        await nc.publish(subject, codec.encode(Ping()), reply=inbox)
        return await asyncio.wait_for(found, timeout)
    except asyncio.TimeoutError:
        if loading:
            raise _not_ready(loading[0]) from None
        who = instance or "any instance"
        raise Unhealthy(f"no pong from {who} on {subject} within {timeout:.1f}s") from None
    finally:
        await nc.close()


def _not_ready(instance: str) -> Unhealthy:
    return Unhealthy(f"{instance} is up but not ready yet (loading its state)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m radixmesh.health", description=__doc__.splitlines()[0])
    p.add_argument("service", nargs="?", choices=SERVICES, help="default: the service PID 1 runs")
    p.add_argument("--nats-url", default=env("NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--subject-prefix", default=env("RADIXMESH_SUBJECT_PREFIX", "rm"))
    p.add_argument("--instance", default=None, help="default: RADIXMESH_INSTANCE or <service>-<hostname>")
    p.add_argument("--any", action="store_true", help="accept a pong from any instance")
    p.add_argument("--url", default=None, help="gateway health URL (default: 127.0.0.1 and RADIXMESH_GATEWAY_PORT)")
    p.add_argument("--timeout", type=float, default=3.0)
    return p.parse_args(argv)


def check(args: argparse.Namespace) -> str:
    """Run the check ``args`` describe; returns a one-line status or raises Unhealthy."""
    service = args.service or service_of_pid1()
    if service == "gateway":
        port = os.environ.get("RADIXMESH_GATEWAY_PORT", "8000")
        return check_http(args.url or f"http://127.0.0.1:{port}/health", args.timeout)
    from libs.protocol.subjects import Subjects  # NOTE: lazy, keeps the HTTP check light

    instance = None if args.any else (args.instance or container_instance(service))
    subject = Subjects(args.subject_prefix).ping(service)
    return asyncio.run(check_ping(args.nats_url, subject, instance, args.timeout))


def main(argv: list[str] | None = None) -> int:
    try:
        print(check(parse_args(argv)))
    except Unhealthy as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
