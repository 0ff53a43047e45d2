"""KV buffers through shared memory between processes of one host: a file under /dev/shm
(tmpfs: memory, no disk) written by the sender, read and removed by the receiver.

Names are ``radixmesh-kv-<token>``; :func:`valid_name` refuses anything else, so a peer's
message can never make a receiver read or delete another file.

:func:`host_id` says which processes can meet this way: the kernel's boot id (one per
running kernel, shared by its containers) and the device number of the /dev/shm mount
(tmpfs mounts differ per container unless they share IPC), plus the hostname for people.
Equal ids: the same kernel and the same /dev/shm.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import socket
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from libs.kernels import KVPool

from .buffer import HEADER_BYTES, KVBuffer, checksum, pack_header
from .errors import SizeMismatch, SlotError, TransferError
from .layout import KVLayout
from .tokens import gather_tokens

SHM_DIR = Path("/dev/shm")
PREFIX = "radixmesh-kv-"
_NAME = re.compile(r"radixmesh-kv-[A-Za-z0-9_.-]{1,200}")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class ShmUnavailable(TransferError):
    """The shared-memory file is missing, unreadable or not where it was announced."""


def host_id(shm_dir: Path = SHM_DIR) -> str:
    """``hostname/boot-id/shm-device``: equal for processes that share a kernel and a /dev/shm."""
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        boot = _machine_id()
    try:
        dev = f"{os.stat(shm_dir).st_dev:x}"
    except OSError:
        dev = "noshm"
    return f"{socket.gethostname()}/{boot}/{dev}"


def _machine_id() -> str:
    try:
        return Path("/etc/machine-id").read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def writable(shm_dir: Path = SHM_DIR) -> bool:
    return shm_dir.is_dir() and os.access(shm_dir, os.W_OK | os.X_OK)


def new_name(owner: str) -> str:
    """A fresh file name for one transfer by ``owner`` (a token: the worker id)."""
    return f"{PREFIX}{owner}-{uuid.uuid4().hex}"


def valid_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name)) and name not in (".", "..")


def export(name: str, pool: KVPool, slots: torch.Tensor, shm_dir: Path = SHM_DIR) -> int:
    """Gather ``slots`` of ``pool`` straight into a new file ``name``, sealed (no copy in
    between); returns its bytes. A failure leaves no file behind."""
    layout = KVLayout.of_pool(pool)
    index = torch.as_tensor(slots, dtype=torch.int64).reshape(-1).to(pool.device)
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= pool.num_slots):
        raise SlotError(f"slots out of range [0, {pool.num_slots})")
    n = len(index)
    size = HEADER_BYTES + n * layout.token_bytes
    with _created(name, size, shm_dir) as mm:
        if n:
            _gather_into(pool, index, mm, layout)
        with memoryview(mm) as view:
            crc = checksum(view[HEADER_BYTES:])
        mm[:HEADER_BYTES] = pack_header(layout, n, size - HEADER_BYTES, crc)
    return size


def _gather_into(pool: KVPool, index: torch.Tensor, mm: mmap.mmap, layout: KVLayout) -> None:
    with warnings.catch_warnings():  # NOTE: torch warns that the mapping is not resizable; it is written only here
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(mm, dtype=torch.uint8, offset=HEADER_BYTES)
    gather_tokens(pool, index, raw.view(layout.torch_dtype).view(len(index), *layout.token_shape))
    del raw  # NOTE: releases the mapping's buffer before it is closed


@contextlib.contextmanager
def _created(name: str, size: int, shm_dir: Path) -> Iterator[mmap.mmap]:
    path = _path(name, shm_dir)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        # NOTE: blocks reserved now: a full /dev/shm (Docker's default is 64 MB) fails here
        # with ENOSPC, not later with SIGBUS when the mapping's pages are written
        os.posix_fallocate(fd, 0, size)
        with mmap.mmap(fd, size) as mm:
            yield mm
    except BaseException:
        remove(name, shm_dir)
        raise
    finally:
        os.close(fd)


def write(name: str, buffer: KVBuffer, shm_dir: Path = SHM_DIR) -> int:
    """Write ``buffer`` sealed (header + payload) into a new file ``name``; returns its bytes.
    A failure leaves no file behind."""
    size = HEADER_BYTES + buffer.nbytes
    with _created(name, size, shm_dir) as mm:
        mm[:HEADER_BYTES] = buffer.header()
        mm[HEADER_BYTES:] = buffer.payload
    return size


def open_buffer(name: str, nbytes: int, shm_dir: Path = SHM_DIR) -> KVBuffer:
    """The buffer in file ``name`` of ``nbytes``, mapped (no copy; the memory lives as long
    as the buffer), the file removed whatever happens; its checksum is checked by
    :meth:`KVBuffer.verify`. Raises ShmUnavailable (missing, unreadable) or a TransferError."""
    path = _path(name, shm_dir)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise ShmUnavailable(f"no shared-memory file {name} (not on this host's /dev/shm?)") from None
    except PermissionError as exc:
        raise ShmUnavailable(f"shared-memory file {name}: {exc.strerror}") from None
    finally:
        remove(name, shm_dir)
    try:
        size = os.fstat(fd).st_size
        if size != nbytes or size < HEADER_BYTES:
            raise SizeMismatch(f"shared-memory file holds {size} bytes, {nbytes} announced")
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return KVBuffer.from_bytes(mm)


def remove(name: str, shm_dir: Path = SHM_DIR) -> None:
    """Delete file ``name`` if it is there (idempotent)."""
    _path(name, shm_dir).unlink(missing_ok=True)


def leftovers(shm_dir: Path = SHM_DIR) -> list[str]:
    """Names of every transfer file present (tests, and a worker's cleanup of its own)."""
    try:
        return sorted(p.name for p in shm_dir.iterdir() if p.name.startswith(PREFIX))
    except OSError:
        return []


def _path(name: str, shm_dir: Path) -> Path:
    if not valid_name(name):
        raise ShmUnavailable(f"not a transfer file name: {name!r}")
    return shm_dir / name
