from __future__ import annotations

from libs.transfer import bench


def test_bench_prints_one_row_per_operation_on_a_tiny_pool(capsys):
    bench.main(["--tokens", "8", "--layers", "2", "--kv-heads", "1", "--head-dim", "4", "--slots", "32",
                "--repeat", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "ms" not in line]
    assert len(rows) == 9
    for row in rows:
        name, best, median, rate = (c.strip() for c in row.strip("|").split("|"))
        assert name and float(best) >= 0 and float(median) >= float(best) and float(rate) >= 0
