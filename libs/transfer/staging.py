"""Worker-local transfer buffers keyed by id: what an export fills and an import drains.

The data paths of later issues (shared memory on one host, NATS chunks across hosts,
a shared store) meet the worker here and only here: they ``put`` a buffer that arrived
and ``take`` one that an export produced.
"""

from __future__ import annotations

import threading

from .buffer import KVBuffer
from .errors import SizeMismatch, TransferError

DEFAULT_MAX_BYTES = 4 << 30


class StagingBuffers:
    """Buffers by id, at most ``max_bytes`` in all. Thread-safe: data paths put and take
    on the event loop while steps run in the worker's step thread.

    NOTE: a step checks its copies against a :meth:`snapshot` and runs them later, so
    each buffer has one consumer: one that a data path put (an arrival) is taken only
    by a step's import; one that a step exported is taken only by a data path (to send
    it). Data paths name their arrivals so they cannot collide with a step's exports
    (e.g. a prefix per path)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buffers: dict[str, KVBuffer] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def __contains__(self, buffer_id: str) -> bool:
        return buffer_id in self._buffers

    def __len__(self) -> int:
        return len(self._buffers)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, buffer_id: str) -> KVBuffer:
        """The buffer, left in place; KeyError when absent."""
        return self._buffers[buffer_id]

    def put(self, buffer_id: str, buffer: KVBuffer) -> None:
        """Store ``buffer`` under a new id; refuses an id in use or a buffer over the budget."""
        with self._lock:
            if buffer_id in self._buffers:
                raise TransferError(f"transfer buffer {buffer_id!r} already exists")
            if self._bytes + buffer.nbytes > self.max_bytes:
                raise SizeMismatch(f"transfer buffer {buffer_id!r} of {buffer.nbytes} bytes exceeds the "
                                   f"staging budget ({self._bytes} of {self.max_bytes} bytes in use)")
            self._buffers[buffer_id] = buffer
            self._bytes += buffer.nbytes

    def take(self, buffer_id: str) -> KVBuffer:
        """Remove and return the buffer; KeyError when absent."""
        with self._lock:
            buffer = self._buffers.pop(buffer_id)
            self._bytes -= buffer.nbytes
        return buffer

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._buffers)

    def snapshot(self) -> tuple[dict[str, KVBuffer], int]:
        """The buffers by id and their bytes in all, at one instant."""
        with self._lock:
            return dict(self._buffers), self._bytes
