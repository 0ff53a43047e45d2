from __future__ import annotations

import pytest
import torch

from libs.transfer import SizeMismatch, StagingBuffers, TransferError, export_slots


def test_put_take_and_the_byte_budget(pool):
    buf = export_slots(pool, torch.tensor([0, 1]))
    staging = StagingBuffers(max_bytes=3 * buf.nbytes)
    staging.put("a", buf)
    staging.put("b", buf)
    assert "a" in staging and len(staging) == 2 and staging.nbytes == 2 * buf.nbytes
    with pytest.raises(TransferError, match="already exists"):
        staging.put("a", buf)
    with pytest.raises(SizeMismatch, match="budget"):
        staging.put("c", export_slots(pool, torch.tensor([0, 1, 2, 3])))
    assert staging.get("a") is buf and "a" in staging
    assert staging.take("a") is buf and "a" not in staging and staging.nbytes == buf.nbytes
    with pytest.raises(KeyError):
        staging.take("a")
    assert staging.ids() == ["b"]


def test_snapshot_is_one_consistent_view(pool):
    staging = StagingBuffers()
    buf = export_slots(pool, torch.tensor([0]))
    staging.put("a", buf)
    found, nbytes = staging.snapshot()
    staging.put("b", buf)  # later changes do not reach a snapshot taken before
    assert found == {"a": buf} and nbytes == buf.nbytes
