"""A sealed KV buffer's bytes in numbered chunks, each with its own CRC-32, and their
reassembly on the other side. Pure: no bus, no pool.

The split is a function of (total bytes, chunk count) alone, so a receiver checks each
chunk's place and length from its own header fields::

    size = ceil(total / count)        chunk i = bytes [i * size, min((i + 1) * size, total))

The wire bytes are the buffer's header followed by its payload (:meth:`KVBuffer.to_bytes`);
chunks are views of the payload, never a copy of the whole (only chunk 0 joins the header).
Each byte is checksummed once per side: the payload's CRC (the header's) is combined from
the chunks' CRCs (libs.transfer.crc) on both ends, never computed in another pass.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .buffer import HEADER_BYTES, KVBuffer, pack_header
from .crc import crc32_combine, crc32_tail
from .errors import ChecksumMismatch, SizeMismatch
from .layout import KVLayout


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


def iter_chunks(layout: KVLayout, num_tokens: int, payload: memoryview, max_chunk: int) -> Iterator[Chunk]:
    """The wire bytes (header + payload) of ``num_tokens`` tokens in ``layout`` as chunks of
    at most ``max_chunk`` bytes. Every byte is checksummed once, when its chunk is taken (so
    checksumming overlaps sending): the payload's CRC in the header follows from the chunks'
    CRCs, so chunk 0 (the header's) comes last."""
    total = HEADER_BYTES + len(payload)
    count = chunk_count(total, max_chunk)
    size = -(-total // count)
    if size < HEADER_BYTES:
        raise ValueError(f"chunks of {size} bytes cannot hold the {HEADER_BYTES}-byte header")
    head = payload[: size - HEADER_BYTES]
    crc = zlib.crc32(head)
    for i in range(1, count):
        start, stop = chunk_span(i, count, total)
        data = payload[start - HEADER_BYTES: stop - HEADER_BYTES]
        chunk_crc = zlib.crc32(data)
        crc = crc32_combine(crc, chunk_crc, len(data))
        yield Chunk(i, count, total, chunk_crc, data)
    header = pack_header(layout, num_tokens, len(payload), crc)
    yield Chunk(0, count, total, crc32_combine(zlib.crc32(header), zlib.crc32(head), len(head)), header + head)


def chunks_of(buffer: KVBuffer, max_chunk: int) -> Iterator[Chunk]:
    """A sealed buffer's chunks (its checksum recomputed from the chunks: the same when intact)."""
    return iter_chunks(buffer.layout, buffer.num_tokens, buffer.payload, max_chunk)


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
        if -(-total_bytes // count) < HEADER_BYTES:
            raise SizeMismatch(f"chunks of {total_bytes // count} bytes cannot hold the {HEADER_BYTES}-byte header")
        # NOTE: not zeroed (bytearray(n) would memset every byte first: ~1 ms per MB here);
        # every byte is written by its chunk before the buffer is read
        self.data = memoryview(np.empty(total_bytes, dtype=np.uint8)).cast("B")
        self._have = bytearray(count)  # 1 per chunk received
        self._crcs = [0] * count
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
        self._crcs[index] = crc
        self.received += 1
        return self.complete

    def buffer(self) -> KVBuffer:
        """The whole buffer (no copy), its payload's CRC known from the chunks' (checked) CRCs:
        ``verify`` compares it with the header's without reading the payload again."""
        if not self.complete:
            raise SizeMismatch(f"transfer incomplete: {self.received} of {self.count} chunks")
        buffer = KVBuffer.from_bytes(self.data)
        buffer.note_checksum(self._payload_crc())
        return buffer

    def _payload_crc(self) -> int:
        total, count = self.total_bytes, self.count
        _, stop = chunk_span(0, count, total)
        header = zlib.crc32(self.data[:HEADER_BYTES])
        crc = crc32_tail(self._crcs[0], header, stop - HEADER_BYTES)
        for i in range(1, count):
            start, stop = chunk_span(i, count, total)
            crc = crc32_combine(crc, self._crcs[i], stop - start)
        return crc
