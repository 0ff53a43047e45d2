"""A second page store: Mooncake Store (kvcache-ai/Mooncake) over its TCP transport.

    mooncake_master      where each object lives, space allocation, eviction (no bytes)
    every worker         a client in-process: mounts ``segment_bytes`` of its host memory into
                         the pool (the store holds the sum of the segments) and reads and writes
                         any segment, its own or a peer's, by the transfer engine (TCP; RDMA
                         where there is a NIC for it)

The client's calls are blocking C++: each runs on this store's own threads (``in_flight`` of
them; a call that hangs holds one, never the event loop) and is bounded by ``timeout_s``.
Gets land in registered memory (``get_into``: one buffer per thread, so a get abandoned at
its timeout cannot write into another's) and leave as bytes; membership is one
``batch_is_exist`` for a whole prefix. Mooncake's values are immutable (a put of a key that
exists keeps the first value: page keys name their content); a full pool evicts old objects
(not those read within the master's lease, 10 s by default). A worker's segment goes with it:
the pages placed there are lost when it stops.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import StoreNotInstalled, StoreUnavailable
from .mooncake_master import DEFAULT_PORT, INSTALL_HINT
from .store import PageSpec, PageStore

log = logging.getLogger("radixmesh.store")

DEFAULT_MASTER = f"127.0.0.1:{DEFAULT_PORT}"
DEFAULT_SEGMENT_BYTES = 4 << 30  # mapped at mount, touched as pages land in it
SETUP_TIMEOUT_S = 10.0
# NOTE: the client's setup and close hold the GIL while they wait (setup ~90 s for a master that is
# not there, close ~11 s for one gone): open probes the master's port first, close skips an unhealthy client
# Mooncake's ErrorCode (mooncake-store/include/types.h); the Python client returns them as ints
_NAMES = {-1: "INTERNAL_ERROR", -101: "SEGMENT_NOT_FOUND", -200: "NO_AVAILABLE_HANDLE", -600: "INVALID_PARAMS",
          -703: "REPLICA_IS_NOT_READY", -704: "OBJECT_NOT_FOUND", -705: "OBJECT_ALREADY_EXISTS",
          -707: "LEASE_EXPIRED", -710: "REPLICA_NOT_FOUND", -712: "REPLICA_IS_GONE", -800: "TRANSFER_FAIL",
          -900: "RPC_FAIL", -901: "RPC_TIMEOUT", -1700: "TENANT_QUOTA_EXCEEDED"}
_GONE = frozenset({-703, -704, -707, -710, -712})  # a get of these: the page is not (or no longer) there
_EXISTS, _TOO_SMALL = -705, -600  # get_into: the value is larger than a page


def _name(code: int) -> str:
    return f"{_NAMES.get(code, 'error')} ({code})"


def _unreachable(code: int) -> bool:
    return code <= -900 and code > -1000


async def _probe(master: str, timeout_s: float) -> None:
    """StoreUnavailable unless something listens at ``master`` (host:port)."""
    host, _, port = master.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host or "127.0.0.1", int(port)), timeout_s)
    except ValueError:
        raise StoreUnavailable(f"Mooncake master address {master!r}: not host:port") from None
    except (OSError, TimeoutError) as exc:
        raise StoreUnavailable(f"no Mooncake master listens at {master} ({type(exc).__name__}): "
                               "start mooncake_master there (radixmesh up starts one)") from None
    writer.close()


def load_client_class() -> type:
    """``mooncake.store.MooncakeDistributedStore``; StoreNotInstalled (what to install) when it does not load."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:  # NOTE: also a missing libibverbs.so.1 / librdmacm.so.1
        raise StoreNotInstalled(f"Mooncake Store does not load ({exc}): {INSTALL_HINT}") from None
    return MooncakeDistributedStore


def route_address(master: str) -> str:
    """This host's address on the route to ``master`` (host:port): what peers reach it by."""
    host = master.rsplit(":", 1)[0] or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((host, 9))  # NOTE: UDP: no packet is sent
            return sock.getsockname()[0]
        except OSError:
            return "127.0.0.1"


@dataclass(frozen=True)
class MooncakeConfig:
    master: str = DEFAULT_MASTER  # mooncake_master's host:port
    metadata: str = "P2PHANDSHAKE"  # or the master's HTTP metadata server (http://host:port/metadata)
    hostname: str = ""  # what peers reach this client at ("": the address on the route to the master)
    segment_bytes: int = DEFAULT_SEGMENT_BYTES  # this client's share of the pool
    protocol: str = "tcp"
    devices: str = ""  # RDMA devices (protocol rdma)


class MooncakeStore(PageStore):
    """Pages in a Mooncake Store: use :meth:`open`; :meth:`close` unmounts this client's segment."""

    def __init__(self, client: Any, spec: PageSpec, config: MooncakeConfig, timeout_s: float = 2.0,
                 in_flight: int = 8) -> None:
        super().__init__(spec, timeout_s, in_flight)
        self.client = client
        self.config = config
        self._buffers = np.zeros((in_flight, spec.value_bytes), dtype=np.uint8)  # one per thread
        self._local = threading.local()
        self._claimed = iter(range(in_flight))
        self._claim = threading.Lock()
        self._pool = ThreadPoolExecutor(in_flight, "mooncake", initializer=self._claim_buffer)
        self._running = 0  # client calls inside the C++ client now (abandoned ones too)
        self._running_lock = threading.Lock()

    @classmethod
    async def open(cls, spec: PageSpec, config: MooncakeConfig = MooncakeConfig(), timeout_s: float = 2.0,
                   in_flight: int = 8, setup_timeout_s: float = SETUP_TIMEOUT_S) -> "MooncakeStore":
        """A client of the master ``config.master``, its segment mounted. Raises StoreNotInstalled
        (the module does not load), StoreUnavailable (no master answered within ``setup_timeout_s``)."""
        client_class = load_client_class()
        await _probe(config.master, min(timeout_s, setup_timeout_s))
        store = cls(client_class(), spec, config, timeout_s, in_flight)
        hostname = config.hostname or route_address(config.master)
        local_buffer = max(16 << 20, 2 * in_flight * spec.value_bytes)  # NOTE: put()'s staging
        try:
            code = await store._call(store.client.setup, hostname, config.metadata, config.segment_bytes,
                                     local_buffer, config.protocol, config.devices, config.master,
                                     timeout_s=setup_timeout_s)
            if code == 0:
                code = await store._call(store.client.register_buffer, store._buffers.ctypes.data,
                                         store._buffers.nbytes)
        except StoreUnavailable:
            code = -900
        if code != 0:
            store._pool.shutdown(wait=False, cancel_futures=True)
            raise StoreUnavailable(f"Mooncake master at {config.master} did not take this client "
                                   f"({_name(code)}; is mooncake_master running there?)")
        return store

    def _claim_buffer(self) -> None:
        with self._claim:
            self._local.buffer = self._buffers[next(self._claimed)]

    async def _call(self, fn: Callable, *args, timeout_s: float | None = None):
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            work = asyncio.get_running_loop().run_in_executor(self._pool, self._counted_call, fn, args)
            return await asyncio.wait_for(work, timeout_s)
        except TimeoutError:  # NOTE: the thread goes on until the client gives up; its buffer is its own
            raise StoreUnavailable(f"Mooncake master at {self.config.master}: no answer within {timeout_s}s") from None
        except RuntimeError as exc:  # the executor was shut down (closed)
            raise StoreUnavailable(f"Mooncake store closed: {exc}") from None

    def _counted_call(self, fn: Callable, args: tuple):
        with self._running_lock:
            self._running += 1
        try:
            return fn(*args)
        finally:
            with self._running_lock:
                self._running -= 1

    async def _idle(self, timeout_s: float) -> bool:
        """Whether every client call has returned within ``timeout_s`` (calls abandoned at
        their timeout go on in their threads until the client gives up)."""
        deadline = time.monotonic() + timeout_s
        while self._running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not self._running

    def _raise_unreachable(self, code: int, what: str) -> None:
        raise StoreUnavailable(f"Mooncake master at {self.config.master}: {what} failed: {_name(code)}")

    async def batch_exists(self, keys: Sequence[str]) -> int:
        """One ``batch_is_exist`` for all ``keys`` (no value moves): the leading run present."""
        keys = list(keys)
        if not keys:
            return 0
        found = await self._counted(self._call(self.client.batch_is_exist, keys))
        leading = next((i for i, code in enumerate(found) if code != 1), len(keys))
        if leading < len(keys) and found[leading] < 0:
            self.stats.errors += 1
            self._raise_unreachable(found[leading], "batch_is_exist")
        return leading

    async def _exists(self, key: str) -> bool:
        code = await self._call(self.client.is_exist, key)
        if code < 0:
            self._raise_unreachable(code, "is_exist")
        return code == 1

    async def _get(self, key: str) -> bytes | None:
        got = await self._call(self._get_into, key)
        if isinstance(got, bytes):
            return got
        if got == _TOO_SMALL:
            return b""  # NOTE: a value larger than a page: fails its check (counted bad)
        if got in _GONE:
            return None
        self._raise_unreachable(got, f"get {key}")

    def _get_into(self, key: str) -> bytes | int:
        """(on a store thread) the value of ``key`` as bytes, or Mooncake's error code."""
        buffer = self._local.buffer
        got = self.client.get_into(key, buffer.ctypes.data, buffer.nbytes)
        return buffer[:got].tobytes() if got >= 0 else got

    async def _set(self, key: str, value: bytes) -> bool:
        code = await self._call(self.client.put, key, value)
        if code in (0, _EXISTS):
            return True
        if _unreachable(code):
            self._raise_unreachable(code, f"put {key}")
        log.warning("put %s refused: %s", key, _name(code))
        return False

    async def close(self) -> None:
        """Unmount this client's segment (its pages leave the store) and stop its threads; with
        the master gone, leave it (its TTL drops the segment; a later close tries again)."""
        try:
            await _probe(self.config.master, self.timeout_s)  # NOTE: close would wait out a gone master
            if not await self._idle(SETUP_TIMEOUT_S):  # NOTE: closing under a running call crashes
                raise StoreUnavailable(f"{self._running} calls still inside the client")
            await self._call(self.client.close, timeout_s=SETUP_TIMEOUT_S)
        except StoreUnavailable as exc:
            log.warning("Mooncake client not closed (its segment is left to the master's TTL): %s", exc)
            return
        self._pool.shutdown(wait=False, cancel_futures=True)
