"""Chunking a sealed buffer and reassembling it: spans, CRCs, any order, every refusal."""

from __future__ import annotations

import random
import zlib

import pytest
import torch

from libs.transfer import HEADER_BYTES, ChecksumMismatch, SizeMismatch, export_slots
from libs.transfer.chunks import Assembly, chunk_count, chunk_span, chunks_of

from .conftest import filled_pool


@pytest.fixture
def buffer():
    return export_slots(filled_pool(), torch.arange(37))


def test_spans_tile_the_bytes_exactly():
    for total, limit in [(1, 1), (100, 7), (1000, 1000), (1001, 1000), (5, 100)]:
        count = chunk_count(total, limit)
        spans = [chunk_span(i, count, total) for i in range(count)]
        assert spans[0][0] == 0 and spans[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert all(0 < stop - start <= limit for start, stop in spans)


@pytest.mark.parametrize("limit", [64, 1000, 1 << 20])
def test_chunks_in_any_order_reassemble_the_wire_bytes(buffer, limit):
    chunks = list(chunks_of(buffer, limit))
    assert chunks[-1].index == 0  # the header's chunk last: its CRC follows from the others
    wire = buffer.to_bytes()
    assert b"".join(bytes(c.data) for c in sorted(chunks, key=lambda c: c.index)) == wire
    assert all(len(c.data) <= limit and c.total_bytes == len(wire) for c in chunks)
    random.Random(0).shuffle(chunks)
    asm = Assembly(chunks[0].count, chunks[0].total_bytes)
    done = [asm.add(c.index, c.count, c.total_bytes, c.crc, c.data) for c in chunks]
    assert done[-1] and not any(done[:-1])
    got = asm.buffer()
    assert "intact" in got.__dict__  # known from the chunks' CRCs: verify reads no byte again
    got.verify(buffer.layout, buffer.num_tokens)
    assert bytes(got.payload) == bytes(buffer.payload)


def _reassembled(chunks) -> Assembly:
    asm = Assembly(chunks[0].count, chunks[0].total_bytes)
    for c in chunks:
        asm.add(c.index, c.count, c.total_bytes, c.crc, c.data)
    return asm


def test_a_payload_changed_with_its_chunk_crc_fails_the_whole_buffer_check(buffer):
    chunks = list(chunks_of(buffer, 500))
    data = bytearray(chunks[3].data)
    data[7] ^= 0x01
    c = chunks[3]
    chunks[3] = type(c)(c.index, c.count, c.total_bytes, zlib.crc32(data), bytes(data))
    with pytest.raises(ChecksumMismatch):
        _reassembled(chunks).buffer().verify(buffer.layout, buffer.num_tokens)


def test_a_header_with_another_checksum_fails_the_whole_buffer_check(buffer):
    chunks = list(chunks_of(buffer, 500))
    head = chunks[-1]
    data = bytearray(head.data)
    data[HEADER_BYTES - 4] ^= 0xFF  # the header's payload CRC
    chunks[-1] = type(head)(0, head.count, head.total_bytes, zlib.crc32(data), bytes(data))
    with pytest.raises(ChecksumMismatch):
        _reassembled(chunks).buffer().verify(buffer.layout, buffer.num_tokens)


def test_a_duplicate_chunk_is_ignored(buffer):
    chunks = list(chunks_of(buffer, 500))
    asm = Assembly(len(chunks), chunks[0].total_bytes)
    c = chunks[1]
    assert not asm.add(c.index, c.count, c.total_bytes, c.crc, c.data)
    assert not asm.add(c.index, c.count, c.total_bytes, c.crc, c.data)
    assert asm.received == 1


def test_a_flipped_byte_fails_its_chunk_crc(buffer):
    c = list(chunks_of(buffer, 500))[2]
    data = bytearray(c.data)
    data[10] ^= 0x40
    asm = Assembly(c.count, c.total_bytes)
    with pytest.raises(ChecksumMismatch):
        asm.add(c.index, c.count, c.total_bytes, c.crc, data)
    assert asm.received == 0


def test_chunks_that_do_not_fit_the_transfer_are_refused(buffer):
    chunks = list(chunks_of(buffer, 500))
    c, n, total = chunks[0], len(chunks), chunks[0].total_bytes
    asm = Assembly(n, total)
    for index, count, size, data in [(n, n, total, c.data), (-1, n, total, c.data), (0, n + 1, total, c.data),
                                     (0, n, total + 1, c.data), (0, n, total, bytes(c.data)[:-1])]:
        with pytest.raises(SizeMismatch):
            asm.add(index, count, size, c.crc, data)
    with pytest.raises(SizeMismatch):
        asm.buffer()  # incomplete
    with pytest.raises(SizeMismatch):
        Assembly(3, HEADER_BYTES - 1)


def test_an_empty_buffer_is_one_chunk_of_its_header():
    buf = export_slots(filled_pool(), torch.arange(0))
    [c] = chunks_of(buf, 1 << 20)
    asm = Assembly(c.count, c.total_bytes)
    assert asm.add(c.index, c.count, c.total_bytes, c.crc, c.data)
    assert asm.buffer().num_tokens == 0 and c.total_bytes == HEADER_BYTES
