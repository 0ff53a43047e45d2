"""A sealed KV buffer's bytes in numbered chunks, each with its own CRC-32, and their
reassembly on the other side. Pure: no bus, no pool.

The split is a function of (total bytes, chunk count) alone, so a receiver checks each
chunk's place and length from its own header fields::

    size = ceil(total / count)        chunk i = bytes [i * size, min((i + 1) * size, total))

The wire bytes are the buffer's header followed by its payload (:meth:`KVBuffer.to_bytes`);
chunks are views of the payload, never a copy of the whole (only chunk 0 joins the header).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from .buffer import HEADER_BYTES, KVBuffer
from .errors import ChecksumMismatch, SizeMismatch


def chunk_count(total: int, max_chunk: int) -> int:
    """How many chunks of at most ``max_chunk`` bytes carry ``total`` bytes (at least one)."""
    if max_chunk <= 0:
        raise ValueError(f"chunk size must be > 0, not {max_chunk}")
    return max(1, -(-total // max_chunk))


def chunk_span(index: int, count: int, total: int) -> tuple[int, int]:
    """Byte range [start, stop) of chunk ``index`` of ``count`` over ``total`` bytes."""
    size = -(-total // count) if count else 0
    start = min(index * size, total)
    return start, min(start + size, total)


@dataclass(frozen=True)
class Chunk:
    index: int
    count: int
    total_bytes: int
    crc: int
    data: bytes | memoryview


def iter_chunks(buffer: KVBuffer, max_chunk: int) -> Iterator[Chunk]:
    """``buffer``'s wire bytes (header + payload) as chunks of at most ``max_chunk`` bytes,
    each CRC computed when it is taken (so checksumming overlaps sending)."""
    header, payload = buffer.header(), buffer.payload
    total = HEADER_BYTES + buffer.nbytes
    count = chunk_count(total, max_chunk)
    for i in range(count):
        start, stop = chunk_span(i, count, total)
        data = _wire_slice(header, payload, start, stop)
        yield Chunk(i, count, total, zlib.crc32(data), data)


def _wire_slice(header: bytes, payload: memoryview, start: int, stop: int) -> bytes | memoryview:
    h = len(header)
    if start >= h:
        return payload[start - h: stop - h]
    return header[start:min(stop, h)] + payload[: max(0, stop - h)]


class Assembly:
    """One transfer's chunks arriving in any order into one preallocated buffer.

    ``add`` raises a TransferError for a chunk that does not fit the transfer (count or
    total changed, index out of range, wrong length) or fails its CRC; a duplicate of a
    chunk already held is ignored. ``complete`` once every chunk arrived; ``buffer()``
    then parses the bytes (no copy): the caller verifies it against its pool."""

    def __init__(self, count: int, total_bytes: int) -> None:
        if count < 1 or total_bytes < HEADER_BYTES or count > total_bytes:
            raise SizeMismatch(f"{count} chunks of {total_bytes} bytes cannot hold a KV buffer")
        self.count = count
        self.total_bytes = total_bytes
        self.data = bytearray(total_bytes)
        self._have = bytearray(count)  # 1 per chunk received
        self.received = 0

    @property
    def complete(self) -> bool:
        return self.received == self.count

    def add(self, index: int, count: int, total_bytes: int, crc: int, data: bytes | memoryview) -> bool:
        """Place one chunk; True when it completed the transfer."""
        if count != self.count or total_bytes != self.total_bytes:
            raise SizeMismatch(f"chunk announces {count} chunks / {total_bytes} bytes, the transfer "
                               f"has {self.count} / {self.total_bytes}")
        if not 0 <= index < count:
            raise SizeMismatch(f"chunk index {index} out of range [0, {count})")
        start, stop = chunk_span(index, count, total_bytes)
        if len(data) != stop - start:
            raise SizeMismatch(f"chunk {index} holds {len(data)} bytes, its span needs {stop - start}")
        if zlib.crc32(data) != crc:
            raise ChecksumMismatch(f"chunk {index} checksum mismatch")
        if self._have[index]:
            return False
        self.data[start:stop] = data
        self._have[index] = 1
        self.received += 1
        return self.complete

    def buffer(self) -> KVBuffer:
        if not self.complete:
            raise SizeMismatch(f"transfer incomplete: {self.received} of {self.count} chunks")
        return KVBuffer.from_bytes(self.data)
