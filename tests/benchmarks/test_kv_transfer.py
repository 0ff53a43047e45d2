"""The KV transfer benchmark end to end on a tiny layout: two processes, every path (Mooncake's
where its engine imports), one row each."""

from __future__ import annotations

from libs.transfer import HEADER_BYTES
from libs.transfer.mooncake import unavailable
from radixmesh.benchmarks import kv_transfer


def test_kv_transfer_moves_every_path_between_two_processes(capsys):
    kv_transfer.main(["--tokens", "40", "--layers", "2", "--kv-heads", "1", "--head-dim", "8", "--slots", "128",
                      "--repeat", "1", "--dtypes", "float32"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| float32") and "memcpy" not in line]
    assert [r.split("|")[2].strip() for r in rows] == ["shm", "nats"] + ([] if unavailable() else ["mooncake"])
    for row in rows:
        _, _, path, mb, chunks, best, median, rate, scatter, total, total_rate, _ = (c.strip() for c in row.split("|"))
        assert float(mb) == round((HEADER_BYTES + 40 * 2 * 2 * 8 * 4) / 1e6, 1) and int(chunks) == 1
        assert 0 < float(best) <= float(median) and float(total) >= float(best) and float(rate) >= 0
