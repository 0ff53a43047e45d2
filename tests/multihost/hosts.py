"""Hosts as Linux network namespaces, for tests of radixmesh across machines (needs root).

A :class:`Bed` is a bridge in the test's own namespace plus N hosts, each a network
namespace with one veth link onto the bridge, its own address (198.18.x.0/24, the range
kept for network tests) and its own hostname. A host runs a NATS node (one cluster over
all hosts) and ``radixmesh up`` against that cluster; the test, in the root namespace,
reaches every host's gateway by its address. :meth:`Host.die` is a host lost whole: every
process in it killed with SIGKILL, then its link cut.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from radixmesh.natsd import NatsServer, Routes, nats_server_binary, wait_for_port

REPO = Path(__file__).resolve().parents[2]
NATS_PORT, ROUTE_PORT, HTTP_PORT = 4222, 6222, 8000


def usable() -> str | None:
    """Why no bed can be made here (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Host:
    def __init__(self, bed: "Bed", index: int) -> None:
        self.name = f"h{index + 1}"
        self.ns = f"{bed.tag}-{self.name}"
        self.ip = f"198.18.{bed.net}.{11 + index}"
        self.link = f"{bed.tag}{index + 1}r"  # the root side of its veth pair
        self.dir = bed.dir / self.name
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{HTTP_PORT}"

    @property
    def nats_url(self) -> str:
        return f"nats://{self.ip}:{NATS_PORT}"

    def create(self, bed: "Bed") -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        inner = f"{bed.tag}{self.name[1:]}n"
        _ip("netns", "add", self.ns)
        _ip("link", "add", self.link, "type", "veth", "peer", "name", inner)
        _ip("link", "set", self.link, "master", bed.bridge, "up")
        _ip("link", "set", inner, "netns", self.ns)
        _ip("-n", self.ns, "link", "set", inner, "name", "eth0")
        _ip("-n", self.ns, "addr", "add", f"{self.ip}/24", "dev", "eth0")
        _ip("-n", self.ns, "link", "set", "eth0", "up")
        _ip("-n", self.ns, "link", "set", "lo", "up")

    def run(self, cmd: list[str], log: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """``cmd`` inside this host (its namespace, its hostname), output to ``log``."""
        wrapped = ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c",
                   f'hostname {self.name} && exec "$@"', "sh", *cmd]
        with open(self.dir / log, "wb") as out:
            proc = subprocess.Popen(wrapped, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, **(env or {})), start_new_session=True)
        self.procs.append(proc)
        return proc

    def start_nats(self, peers: list["Host"]) -> None:
        routes = tuple(f"nats://{p.ip}:{ROUTE_PORT}" for p in peers if p is not self)
        node = NatsServer(port=NATS_PORT, host=self.ip, server_name=self.name,
                          jetstream_dir=self.dir / "jetstream",
                          cluster=Routes("radixmesh", ROUTE_PORT, routes))
        conf = self.dir / "nats.conf"
        conf.write_text(node.config_text())
        self.run([nats_server_binary(), "-a", self.ip, "-p", str(NATS_PORT), "-c", str(conf)], "nats.log")
        wait_for_port(NATS_PORT, host=self.ip)

    def start_stack(self, nats_url: str, args: list[str]) -> None:
        """``radixmesh up`` on this host against the cluster (its gateway on port 8000)."""
        self.run([sys.executable, "-m", "radixmesh.cli", "up", "--host", "0.0.0.0", "--port", str(HTTP_PORT),
                  "--no-traces", "--log-dir", str(self.dir / "logs"), *args], "up.log",
                 env={"NATS_URL": nats_url})

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def partition(self, cut: bool) -> None:
        """Cut (or restore) this host's link; its processes keep running."""
        _ip("link", "set", self.link, "down" if cut else "up")

    def die(self) -> None:
        """Lost whole: every process SIGKILLed, then the link cut (no goodbye on the wire)."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _ip("link", "set", self.link, "down")

    def remove(self) -> None:
        self.die() if self.pids() else None
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


class Bed:
    def __init__(self, hosts: int, work: Path) -> None:
        self.tag = f"rm{os.getpid() % 0xFFFF:04x}"
        self.net = os.getpid() % 200 + 20
        self.bridge = f"{self.tag}br"
        self.dir = work
        self.hosts = [Host(self, i) for i in range(hosts)]

    @property
    def nats_url(self) -> str:
        return ",".join(h.nats_url for h in self.hosts)

    def __enter__(self) -> "Bed":
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"198.18.{self.net}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for host in self.hosts:
                host.create(self)
        except BaseException:
            self.__exit__()
            raise
        return self

    def start(self, up_args: list[str]) -> None:
        """A NATS node on every host (one cluster), then ``radixmesh up`` on every host."""
        for host in self.hosts:
            host.start_nats(self.hosts)
        time.sleep(1.0)  # NOTE: the routes form in about a second; the services fail over anyway
        for host in self.hosts:
            host.start_stack(self.nats_url, up_args)

    def __exit__(self, *exc) -> None:
        for host in self.hosts:
            host.remove()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
