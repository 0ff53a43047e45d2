"""A ``mooncake_master`` child process: Mooncake Store's master (the binary ships in the
``mooncake`` extra's wheel). It keeps where each object lives and allocates space; the bytes
live in the clients' segments (each worker mounts one), not in the master.

Listens on ``host:port`` (RPC) and a free loopback port for its metrics; no HTTP metadata
server (the clients find each other by ``P2PHANDSHAKE``), no metric reporting to the log."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import time
from pathlib import Path

from .errors import StoreNotInstalled

INSTALL_HINT = ("pip install 'radixmesh[mooncake]' (mooncake-transfer-engine-non-cuda); its library "
                "needs the Debian packages libibverbs1 and librdmacm1 (apt-get install libibverbs1 librdmacm1)")
DEFAULT_PORT = 50051  # mooncake_master's own default


def master_binary() -> str:
    """The wheel's ``mooncake_master`` (found without importing mooncake, which needs libibverbs)."""
    spec = importlib.util.find_spec("mooncake")
    binary = Path(spec.origin).parent / "mooncake_master" if spec and spec.origin else None
    if binary is None or not binary.is_file():
        raise StoreNotInstalled(f"mooncake_master not found: {INSTALL_HINT}")
    return str(binary)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class MooncakeMaster:
    """A ``mooncake_master`` on ``host:port`` (default a free loopback port); its log file is
    emptied at the first start and appended to by a restart."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1",
                 log_file: str | os.PathLike | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_file = Path(log_file) if log_file else None
        self.proc: subprocess.Popen | None = None
        self._started = False

    @property
    def address(self) -> str:
        """What a client's ``master_server_addr`` is (``host:port``)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"{host}:{self.port}"

    def command(self) -> list[str]:
        return [master_binary(), f"--rpc_port={self.port}", f"--rpc_address={self.host}",
                "--metrics_host=127.0.0.1", f"--metrics_port={free_port()}", "--enable_metric_reporting=false"]

    def start(self, timeout: float = 10.0) -> "MooncakeMaster":
        command = self.command()
        out = open(self.log_file, "ab" if self._started else "wb") if self.log_file else subprocess.DEVNULL
        try:  # NOTE: its own process group: a terminal's Ctrl-C reaches the launcher, which stops it last
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, process_group=0)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        self._started = True
        try:
            self._wait_listening(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_listening(self, timeout: float) -> None:
        host = self.address.rsplit(":", 1)[0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with code {self.proc.returncode} "
                                   f"(log: {self.log_file or 'not kept'})")
            with contextlib.suppress(OSError), socket.create_connection((host, self.port), timeout=0.2):
                return
            time.sleep(0.05)
        raise TimeoutError(f"mooncake_master did not listen on {self.address} within {timeout:g}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> "MooncakeMaster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
