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

import os
import re
import socket
import uuid
from pathlib import Path

from .buffer import HEADER_BYTES, KVBuffer
from .errors import SizeMismatch, TransferError

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


def write(name: str, buffer: KVBuffer, shm_dir: Path = SHM_DIR) -> int:
    """Write ``buffer`` sealed (header + payload, the payload not copied in memory) into
    a new file ``name``; returns the bytes written. A failure leaves no file behind."""
    path = _path(name, shm_dir)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            f.write(buffer.header())
            _write_all(f, buffer.payload)
    except BaseException:
        remove(name, shm_dir)
        raise
    return HEADER_BYTES + buffer.nbytes


def _write_all(f, view: memoryview) -> None:
    done = 0
    while done < len(view):
        done += f.write(view[done:])


def read(name: str, nbytes: int, shm_dir: Path = SHM_DIR) -> bytearray:
    """The ``nbytes`` of file ``name``, which is removed whatever happens; raises
    ShmUnavailable (missing, unreadable) or SizeMismatch (not ``nbytes`` long)."""
    path = _path(name, shm_dir)
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size != nbytes:
                raise SizeMismatch(f"shared-memory file holds {size} bytes, {nbytes} announced")
            data = bytearray(nbytes)
            got = f.readinto(data)
            while got < nbytes:
                step = f.readinto(memoryview(data)[got:])
                if not step:
                    raise SizeMismatch(f"shared-memory file ended after {got} of {nbytes} bytes")
                got += step
            return data
    except FileNotFoundError:
        raise ShmUnavailable(f"no shared-memory file {name} (not on this host's /dev/shm?)") from None
    except PermissionError as exc:
        raise ShmUnavailable(f"shared-memory file {name}: {exc.strerror}") from None
    finally:
        remove(name, shm_dir)


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
