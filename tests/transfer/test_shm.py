"""Shared-memory files: written sealed, read once and removed, refused names, no leftovers."""

from __future__ import annotations

import os

import pytest
import torch

from libs.transfer import HEADER_BYTES, KVBuffer, SizeMismatch, export_slots, shm

from .conftest import filled_pool


@pytest.fixture
def shm_dir(tmp_path):
    return tmp_path


def test_write_read_round_trip_removes_the_file(shm_dir):
    buf = export_slots(filled_pool(), torch.arange(20))
    name = shm.new_name("w1")
    assert shm.write(name, buf, shm_dir) == HEADER_BYTES + buf.nbytes
    assert shm.leftovers(shm_dir) == [name]
    data = shm.read(name, HEADER_BYTES + buf.nbytes, shm_dir)
    assert bytes(data) == buf.to_bytes()
    KVBuffer.from_bytes(data).verify(buf.layout, 20)
    assert shm.leftovers(shm_dir) == []


def test_a_wrong_size_or_missing_file_is_refused_and_removed(shm_dir):
    buf = export_slots(filled_pool(), torch.arange(4))
    name = shm.new_name("w1")
    shm.write(name, buf, shm_dir)
    with pytest.raises(SizeMismatch):
        shm.read(name, HEADER_BYTES + buf.nbytes + 1, shm_dir)
    assert shm.leftovers(shm_dir) == []
    with pytest.raises(shm.ShmUnavailable):
        shm.read(name, 10, shm_dir)


@pytest.mark.parametrize("name", ["../etc/passwd", "radixmesh-kv-a/b", "other-file", "radixmesh-kv-", ""])
def test_names_outside_the_transfer_namespace_are_refused(shm_dir, name):
    (shm_dir / "other-file").write_bytes(b"x")
    with pytest.raises(shm.ShmUnavailable):
        shm.read(name, 1, shm_dir)
    with pytest.raises(shm.ShmUnavailable):
        shm.remove(name, shm_dir)
    assert (shm_dir / "other-file").exists()


def test_an_existing_name_is_not_overwritten(shm_dir):
    buf = export_slots(filled_pool(), torch.arange(2))
    name = shm.new_name("w1")
    shm.write(name, buf, shm_dir)
    with pytest.raises(FileExistsError):
        shm.write(name, buf, shm_dir)
    assert len(shm.read(name, HEADER_BYTES + buf.nbytes, shm_dir)) == HEADER_BYTES + buf.nbytes


def test_host_id_is_stable_and_names_the_shm_mount():
    a, b = shm.host_id(), shm.host_id()
    assert a == b and a.count("/") == 2
    assert a.endswith(f"/{os.stat('/dev/shm').st_dev:x}")
