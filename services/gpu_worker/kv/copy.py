"""A step's KV copies (ForwardBatch.copies): checked as a whole, then run in order
before the step's forward. The scheduler decides; this only moves bytes.

    d2h     device slots -> host pool slots        (HostKVPool.save)
    h2d     host pool slots -> device slots        (HostKVPool.load)
    export  device slots -> a new staging buffer   (export_slots)
    import  a staging buffer -> device slots       (import_slots; the buffer is consumed)
    put     host pool slots -> the shared store      (copied now, uploaded later: store_io.py)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from libs.kernels import KVPool
from libs.protocol.errors import invalid_request
from libs.protocol.messages import KVCopy
from libs.transfer import HostKVPool, KVLayout, StagingBuffers, TransferError, export_slots, import_slots, valid_key

if TYPE_CHECKING:
    from .store_io import StoreIO


@dataclass(frozen=True)
class CopyOp:
    """One checked copy: slot indices as CPU int64 tensors."""

    kind: str
    src: torch.Tensor
    dst: torch.Tensor
    buffer: str
    keys: tuple[str, ...] = ()


class KVCopier:
    """Owns the worker's host pool (``host_slots`` > 0) and staging buffers, and runs copies."""

    def __init__(self, pool: KVPool, host_slots: int = 0, staging: StagingBuffers | None = None) -> None:
        if host_slots < 0:
            raise ValueError(f"host KV slots must be >= 0, not {host_slots}")
        self.pool = pool
        self.layout = KVLayout.of_pool(pool)
        self.host = HostKVPool.for_pool(pool, host_slots) if host_slots else None
        self.staging = staging if staging is not None else StagingBuffers()
        self.store_io: StoreIO | None = None  # the shared store, attached by the service (puts)
        self.last_seconds = 0.0

    @property
    def host_slots(self) -> int:
        return self.host.num_slots if self.host is not None else 0

    @property
    def store_page_tokens(self) -> int:
        return self.store_io.page_tokens if self.store_io is not None else 0

    def run(self, copies: list[KVCopy]) -> None:
        """Check every copy, then run them in order (nothing runs if one is bad: 400).
        ``last_seconds``: how long the last step's copies took (the scheduler turns it
        into a load-back rate). NOTE: on CUDA a copy may still be in flight then."""
        self.last_seconds = 0.0
        ops = self.check(copies)
        start = time.perf_counter()
        self.execute(ops)
        self.last_seconds = time.perf_counter() - start if ops else 0.0

    def check(self, copies: list[KVCopy]) -> list[CopyOp]:
        """Every copy checked against the pools and the buffers the earlier copies leave;
        raises ServiceError(invalid_request_error, 400) before touching any state."""
        if not copies:
            return []
        books = _Books(self.staging, self.layout.token_bytes)
        return [self._check_one(i, copy, books) for i, copy in enumerate(copies)]

    def execute(self, ops: list[CopyOp]) -> None:
        for op in ops:
            if op.kind == "d2h":
                self.host.save(self.pool, op.src, op.dst)
            elif op.kind == "h2d":
                self.host.load(self.pool, op.src, op.dst)
            elif op.kind == "export":
                self.staging.put(op.buffer, export_slots(self.pool, op.src))
            elif op.kind == "put":
                self.store_io.stage_put(list(op.keys), op.src)
            else:
                import_slots(self.pool, op.dst, self.staging.take(op.buffer))

    def _check_one(self, i: int, copy: KVCopy, books: "_Books") -> CopyOp:
        where = f"copies[{i}] ({copy.kind})"
        src, dst = _slots(copy.src, f"{where}.src"), _slots(copy.dst, f"{where}.dst")
        device, host = self.pool.num_slots, self.host_slots
        if copy.kind == "put":
            self._check_put(copy, src, dst, where)
        elif copy.kind in ("d2h", "h2d"):
            _check(host > 0, f"{where}: this worker has no host KV pool (--host-kv-slots 0)")
            _check(len(src) == len(dst), f"{where}: {len(src)} source slots for {len(dst)} destination slots")
            _check(not copy.buffer, f"{where}: takes no transfer buffer")
            src_size, dst_size = (device, host) if copy.kind == "d2h" else (host, device)
            _check_slots(src, src_size, f"{where}.src")
            _check_slots(dst, dst_size, f"{where}.dst", unique=True)
        elif copy.kind == "export":
            _check(bool(copy.buffer) and not len(dst), f"{where}: needs a buffer id and no dst slots")
            _check_slots(src, device, f"{where}.src")
            books.export(copy.buffer, len(src), where)
        else:
            _check(copy.kind == "import", f"{where}: unknown kind (d2h, h2d, export, import or put)")
            _check(bool(copy.buffer) and not len(src), f"{where}: needs a buffer id and no src slots")
            _check_slots(dst, device, f"{where}.dst", unique=True)
            books.take(copy.buffer, len(dst), self.layout, where)
        return CopyOp(copy.kind, torch.from_numpy(src), torch.from_numpy(dst), copy.buffer, tuple(copy.keys))

    def _check_put(self, copy: KVCopy, src: np.ndarray, dst: np.ndarray, where: str) -> None:
        page = self.store_page_tokens
        _check(page > 0, f"{where}: this worker has no shared KV store (--kv-store none)")
        _check(not len(dst) and not copy.buffer, f"{where}: takes host src slots and keys only")
        _check(bool(copy.keys) and len(src) == len(copy.keys) * page,
               f"{where}: {len(src)} slots for {len(copy.keys)} keys of {page} tokens")
        _check(all(valid_key(k) for k in copy.keys), f"{where}: keys must be store keys (libs.transfer.page_key)")
        _check_slots(src, self.host_slots, f"{where}.src")


class _Books:
    """Which buffers exist after each copy of a batch (tokens by id), and their bytes."""

    def __init__(self, staging: StagingBuffers, token_bytes: int) -> None:
        self.max_bytes = staging.max_bytes
        self.token_bytes = token_bytes
        self.staged, self.nbytes = staging.snapshot()  # those that arrived before this batch
        self.tokens = {i: b.num_tokens for i, b in self.staged.items()}
        self.fresh: set[str] = set()  # exported by this batch

    def export(self, buffer_id: str, num_tokens: int, where: str) -> None:
        _check(buffer_id not in self.tokens, f"{where}: transfer buffer {buffer_id!r} already exists")
        size = num_tokens * self.token_bytes
        _check(self.nbytes + size <= self.max_bytes,
               f"{where}: {size} bytes exceed the staging budget ({self.nbytes} of {self.max_bytes} bytes in use)")
        self.tokens[buffer_id] = num_tokens
        self.fresh.add(buffer_id)
        self.nbytes += size

    def take(self, buffer_id: str, num_tokens: int, layout: KVLayout, where: str) -> None:
        _check(buffer_id in self.tokens, f"{where}: no transfer buffer {buffer_id!r}")
        held = self.tokens.pop(buffer_id)
        if buffer_id in self.fresh:  # exported earlier in this batch: the pool's own layout
            self.fresh.discard(buffer_id)
            _check(held == num_tokens, f"{where}: buffer {buffer_id!r} holds {held} tokens, "
                                       f"{num_tokens} slots given")
            self.nbytes -= held * self.token_bytes
            return
        buffer = self.staged[buffer_id]  # it arrived before this batch: check it whole now
        try:
            buffer.verify(layout, num_tokens)
        except TransferError as exc:
            raise invalid_request(f"{where}: {exc}") from None
        self.nbytes -= buffer.nbytes


def _slots(values: list[int], name: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.int64).reshape(-1)
    except (OverflowError, ValueError, TypeError):
        raise invalid_request(f"{name}: not a list of 64-bit integers") from None


def _check_slots(slots: np.ndarray, size: int, name: str, unique: bool = False) -> None:
    _check(not len(slots) or (int(slots.min()) >= 0 and int(slots.max()) < size),
           f"{name}: slot out of range [0, {size})")
    _check(not unique or len(np.unique(slots)) == len(slots), f"{name}: slots repeat")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise invalid_request(message)
