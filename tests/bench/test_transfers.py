from libs.protocol.messages import SchedStats
from radixmesh.bench.transfers import Transfers, transfer_table


def _stats(worker, **kw) -> SchedStats:
    return SchedStats(worker_id=worker, steps=1, running=0, waiting=0, free_slots=0,
                      max_batch_size=1, batch_size_hist={}, tokens_generated=0,
                      requests_finished=0, **kw)


def test_totals_over_the_prefill_and_the_decode_side():
    t = Transfers.total([
        _stats("p0", kv_transfers_out=3),
        _stats("d1", kv_transfers_in=2, kv_transfer_bytes=70_000_000, kv_transfer_seconds=0.5,
               kv_transfer_failures={"deadline": 1}),
        _stats("d2", kv_transfer_failures={"deadline": 1, "checksum": 1}),
    ])
    assert (t.sent, t.received, t.nbytes, t.seconds) == (3, 2, 70_000_000, 0.5)
    assert t.failures == {"deadline": 2, "checksum": 1} and t.failed == 3


def test_table_rows_per_system_with_means_and_reasons():
    table = transfer_table([
        ("radixmesh", "2 colocated", Transfers()),
        ("radixmesh-pd", "1 prefill + 1 decode",
         Transfers(2, 2, 70_000_000, 0.5, {"deadline": 1})),
        ("radixmesh-x", "2 colocated", None),
    ])
    lines = table.splitlines()
    assert len(lines) == 5 and "MB moved" in lines[0]
    assert lines[2] == "| radixmesh | 2 colocated | 0/0 | 0.0 | - | - | 0 |"
    assert lines[3] == "| radixmesh-pd | 1 prefill + 1 decode | 2/2 | 70.0 | 35.0 | 250 | 1 (deadline: 1) |"
    assert lines[4] == "| radixmesh-x | 2 colocated | - | - | - | - | - |"


def test_the_difference_of_two_readings_is_what_happened_between():
    before = Transfers(1, 1, 10, 0.5, {"deadline": 1, "checksum": 2})
    after = Transfers(4, 5, 40, 2.0, {"deadline": 3, "checksum": 2})
    assert after.since(before) == Transfers(3, 4, 30, 1.5, {"deadline": 2})
