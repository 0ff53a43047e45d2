from __future__ import annotations

from radixmesh.benchmarks import page_store


def test_page_store_prints_one_row_per_operation_on_a_tiny_layout(capsys):
    page_store.main(["--tokens", "40", "--layers", "2", "--kv-heads", "1", "--head-dim", "4", "--repeat", "1"])
    out = capsys.readouterr().out
    assert out.startswith("2 pages of 16 tokens (32 of a 40-token prefix)")
    rows = [line for line in out.splitlines() if line.startswith("| ") and "ms" not in line]
    assert [r.split("|")[1].split(" (")[0].split(",")[0].strip() for r in rows] == [
        "seal pages", "put", "exists", "get", "get", "fetch into a host pool"]
    for row in rows:
        name, best, median, rate = (c.strip() for c in row.strip("|").split("|"))
        assert float(best) > 0 and float(median) >= float(best)
        assert rate == "-" if name.startswith("exists") else float(rate) >= 0


def test_page_store_measures_mooncake_beside_jetstream_when_asked(capsys):
    from ..transfer.mooncake import require_mooncake

    require_mooncake()
    page_store.main(["--backend", "mooncake", "--tokens", "40", "--layers", "2", "--kv-heads", "1",
                     "--head-dim", "4", "--repeat", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| mooncake")]
    assert [r.split(":")[1].split("(")[0].strip() for r in rows] == ["put", "exists", "get", "fetch into a host pool"]
    assert all(float(r.split("|")[2]) > 0 for r in rows)
