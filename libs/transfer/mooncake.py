"""KV buffers over the Mooncake Transfer Engine (``mooncake-transfer-engine-non-cuda``):
its TCP transport with the P2P handshake, so no metadata server, no RDMA, no GPU.

The receiver registers one landing buffer per transfer (:meth:`MooncakeEngine.land`)
and names its session (``host:rpc port``) and the buffer's address to the sender,
which writes the sealed buffer (header + payload, :func:`libs.transfer.codec.export_wire`)
there in one :meth:`MooncakeEngine.write`. The receiver then unregisters it
(:meth:`Landing.seal`: nothing can write it any more) and verifies it like a buffer of
any other path. The engine refuses a write outside registered memory, so a peer can
write only where it was invited.

The wheel's module imports only with ``libibverbs1`` and ``librdmacm1`` installed
(even for TCP); :func:`unavailable` says why it cannot be used here.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

import numpy as np

from .buffer import KVBuffer
from .errors import TransferError

log = logging.getLogger("transfer.mooncake")

INSTALL_HINT = ("pip install 'radixmesh[mooncake]' (mooncake-transfer-engine-non-cuda), "
                "and apt-get install libibverbs1 librdmacm1")


class MooncakeUnavailable(TransferError):
    """The engine cannot be imported or started here."""


class MooncakeWriteFailed(TransferError):
    """A write did not complete: the peer is unreachable, or refused the address."""


def _engine_class():
    os.environ.setdefault("GLOG_minloglevel", "2")  # NOTE: else it logs every handshake (INFO, WARNING)
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise MooncakeUnavailable(f"the Mooncake transfer engine does not import ({exc}): {INSTALL_HINT}") from None
    return TransferEngine


def unavailable() -> str:
    """Why the engine cannot be used here ("" when it can be imported)."""
    try:
        _engine_class()
    except MooncakeUnavailable as exc:
        return str(exc)
    return ""


def default_host() -> str:
    """The address peers reach this host at: its name resolved, else loopback."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class MooncakeEngine:
    """One transfer engine of this process (TCP, P2P handshake), listening on ``host``."""

    def __init__(self, host: str = "") -> None:
        self.host = host or default_host()
        self._engine = _engine_class()()
        if self._engine.initialize(self.host, "P2PHANDSHAKE", "tcp", "") != 0:
            raise MooncakeUnavailable(f"the Mooncake transfer engine did not start on {self.host}")
        self.session_id = f"{self.host}:{self._engine.get_rpc_port()}"
        self._lock = threading.Lock()  # NOTE: (un)registrations from the loop, writes from threads

    def land(self, nbytes: int) -> Landing:
        """A new registered buffer of ``nbytes`` that peers may write into."""
        if nbytes <= 0:
            raise TransferError(f"a landing buffer needs a positive size, not {nbytes}")
        data = np.empty(nbytes, dtype=np.uint8)  # NOTE: not zeroed: every byte is written before it is read
        with self._lock:
            if self._engine.register_memory(data.ctypes.data, nbytes) != 0:
                raise MooncakeUnavailable(f"the engine did not register {nbytes} bytes")
        return Landing(self, data)

    def _unregister(self, address: int) -> None:
        with self._lock:
            if self._engine.unregister_memory(address) != 0:
                log.warning("the engine did not unregister the buffer at %#x", address)

    def write(self, session_id: str, data: np.ndarray, address: int) -> None:
        """Write ``data`` (contiguous bytes) at ``address`` of peer ``session_id``; blocks
        until it is there (run it in a thread: the engine releases the GIL)."""
        if self._engine.transfer_sync_write(session_id, data.ctypes.data, address, data.nbytes) < 0:
            raise MooncakeWriteFailed(f"writing {data.nbytes} bytes to {session_id} at {address:#x} failed")


class Landing:
    """A registered receive buffer: written by a peer, then sealed (unregistered, parsed)."""

    def __init__(self, engine: MooncakeEngine, data: np.ndarray) -> None:
        self.engine, self.data = engine, data
        self.address, self.nbytes = data.ctypes.data, data.nbytes
        self._registered = True

    def release(self) -> None:
        """No more writes (idempotent). NOTE: keep ``data`` alive a while after a release
        that no ``seal`` followed: a write the peer started may still be arriving."""
        if self._registered:
            self._registered = False
            self.engine._unregister(self.address)

    def seal(self) -> KVBuffer:
        """Released, then parsed (no copy): the caller verifies it against its pool."""
        self.release()
        return KVBuffer.from_bytes(self.data)
