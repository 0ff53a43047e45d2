"""Shared-memory files: exported or written sealed, mapped once and removed, refused names,
no leftovers."""

from __future__ import annotations

import os

import pytest
import torch

from libs.transfer import HEADER_BYTES, ChecksumMismatch, SizeMismatch, SlotError, export_slots, shm

from .conftest import filled_pool


@pytest.fixture
def shm_dir(tmp_path):
    return tmp_path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_export_gathers_into_the_file_what_export_slots_seals(shm_dir, dtype):
    pool, slots = filled_pool(dtype=dtype), torch.tensor([5, 1, 60, 7, 33])
    expected = export_slots(pool, slots)
    name = shm.new_name("w1")
    assert shm.export(name, pool, slots, shm_dir) == HEADER_BYTES + expected.nbytes
    assert (shm_dir / name).read_bytes() == expected.to_bytes()
    got = shm.open_buffer(name, HEADER_BYTES + expected.nbytes, shm_dir)
    assert shm.leftovers(shm_dir) == []  # removed at once: the mapping keeps the bytes
    got.verify(expected.layout, 5)
    assert bytes(got.payload) == bytes(expected.payload)


def test_write_then_open_round_trips_and_an_empty_export_is_a_header(shm_dir):
    buf = export_slots(filled_pool(), torch.arange(20))
    name = shm.new_name("w1")
    assert shm.write(name, buf, shm_dir) == HEADER_BYTES + buf.nbytes
    assert bytes(shm.open_buffer(name, HEADER_BYTES + buf.nbytes, shm_dir).payload) == bytes(buf.payload)
    empty = shm.new_name("w1")
    assert shm.export(empty, filled_pool(), torch.arange(0), shm_dir) == HEADER_BYTES
    assert shm.open_buffer(empty, HEADER_BYTES, shm_dir).num_tokens == 0
    assert shm.leftovers(shm_dir) == []


def test_a_flipped_byte_in_the_file_fails_the_buffer_check(shm_dir):
    buf = export_slots(filled_pool(), torch.arange(6))
    name = shm.new_name("w1")
    shm.write(name, buf, shm_dir)
    data = bytearray((shm_dir / name).read_bytes())
    data[HEADER_BYTES + 9] ^= 0x02
    (shm_dir / name).write_bytes(data)
    with pytest.raises(ChecksumMismatch):
        shm.open_buffer(name, len(data), shm_dir).verify(buf.layout, 6)


def test_a_bad_export_or_a_wrong_size_or_missing_file_leaves_nothing(shm_dir):
    with pytest.raises(SlotError):
        shm.export(shm.new_name("w1"), filled_pool(), torch.tensor([0, 64]), shm_dir)
    buf = export_slots(filled_pool(), torch.arange(4))
    name = shm.new_name("w1")
    shm.write(name, buf, shm_dir)
    with pytest.raises(SizeMismatch):
        shm.open_buffer(name, HEADER_BYTES + buf.nbytes + 1, shm_dir)
    assert shm.leftovers(shm_dir) == []
    with pytest.raises(shm.ShmUnavailable):
        shm.open_buffer(name, 10, shm_dir)


@pytest.mark.parametrize("name", ["../etc/passwd", "radixmesh-kv-a/b", "other-file", "radixmesh-kv-", ""])
def test_names_outside_the_transfer_namespace_are_refused(shm_dir, name):
    (shm_dir / "other-file").write_bytes(b"x" * HEADER_BYTES)
    with pytest.raises(shm.ShmUnavailable):
        shm.open_buffer(name, HEADER_BYTES, shm_dir)
    with pytest.raises(shm.ShmUnavailable):
        shm.remove(name, shm_dir)
    assert (shm_dir / "other-file").exists()


def test_an_existing_name_is_not_overwritten(shm_dir):
    buf = export_slots(filled_pool(), torch.arange(2))
    name = shm.new_name("w1")
    shm.write(name, buf, shm_dir)
    with pytest.raises(FileExistsError):
        shm.write(name, export_slots(filled_pool(seed=3), torch.arange(2)), shm_dir)
    assert bytes(shm.open_buffer(name, HEADER_BYTES + buf.nbytes, shm_dir).payload) == bytes(buf.payload)


def test_host_id_is_stable_and_names_the_shm_mount():
    a, b = shm.host_id(), shm.host_id()
    assert a == b and a.count("/") == 2
    assert a.endswith(f"/{os.stat('/dev/shm').st_dev:x}")
