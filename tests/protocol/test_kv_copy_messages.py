"""ForwardBatch.copies on the wire: round trip, old senders still valid, kinds checked."""

from __future__ import annotations

import msgspec
import pytest

from libs.protocol.codec import decode, encode
from libs.protocol.messages import ForwardBatch, KVCopy, WorkerInfo

STEP = dict(step=3, new_rows=[], rows=[0], prefix_lens=[4], extend_lens=[1], input_ids=[7], out_slots=[9])


def test_copies_round_trip_in_order():
    copies = [KVCopy(kind="export", src=[1, 2], buffer="b1"), KVCopy(kind="d2h", src=[1, 2], dst=[0, 1]),
              KVCopy(kind="import", dst=[5, 6], buffer="b1"), KVCopy(kind="h2d", src=[0, 1], dst=[3, 4])]
    got = decode(encode(ForwardBatch(**STEP, copies=copies)), ForwardBatch)
    assert got.copies == copies


def test_a_sender_without_copies_is_still_valid():
    class OldForwardBatch(msgspec.Struct, kw_only=True, tag="forward.v1"):  # the fields before copies
        step: int
        new_rows: list
        rows: list[int]
        prefix_lens: list[int]
        extend_lens: list[int]
        input_ids: list[int]
        out_slots: list[int]

    got = decode(msgspec.msgpack.encode(OldForwardBatch(**STEP)), ForwardBatch)
    assert got.copies == [] and got.rows == [0]
    info = decode(encode(WorkerInfo(worker_id="w", model="m", kv_slots=1, max_requests=1, max_model_len=1,
                                    vocab_size=1, eos_token_ids=[], dtype="float32")), WorkerInfo)
    assert info.host_kv_slots == 0


def test_an_unknown_copy_kind_is_refused():
    bad = msgspec.msgpack.encode({"type": "forward.v1", **STEP, "copies": [["move", [1], [2], ""]]})
    with pytest.raises(msgspec.ValidationError):
        decode(bad, ForwardBatch)
