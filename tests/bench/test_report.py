import json
import math

from radixmesh.bench.record import Record
from radixmesh.bench.report import markdown_table, plot, write_json
from radixmesh.bench.stats import summarize


def _records():
    return [Record("stack", f"r{i}", "question", ttft_s=0.1 * (i + 1), e2e_s=1.0,
                   completion_tokens=4, prompt_tokens=10, cached_tokens=5,
                   itl_s=[0.1, 0.2, 0.3]) for i in range(3)] + [
        Record("hf", "r0", "question", ttft_s=0.5, e2e_s=2.0, completion_tokens=1,
               prompt_tokens=10)]


def test_table_has_one_row_per_system_and_dashes_for_nan():
    recs = _records()
    table = markdown_table([summarize("stack", recs[:3], 2.0), summarize("hf", recs[3:], 2.0)])
    lines = table.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| system | ok/failed | req/s")
    assert lines[2].startswith("| stack | 3/0 | 1.50 | 6.0 | 200 |") and "50.0%" in lines[2]
    assert "| - | - |" in lines[3]  # no TPOT for one-token answers


def test_json_has_every_record_and_no_nan(tmp_path):
    recs = _records()
    summaries = [summarize("stack", recs[:3], 2.0), summarize("hf", recs[3:], 2.0)]
    assert math.isnan(summaries[1].tpot_p50_ms)
    write_json(tmp_path / "r.json", {"seed": 0}, summaries, recs)
    body = json.loads((tmp_path / "r.json").read_text())  # strict: NaN would not parse back
    assert len(body["records"]) == 4 and body["records"][0]["itl_s"] == [0.1, 0.2, 0.3]
    assert body["summaries"][1]["tpot_p50_ms"] is None


def test_plots_are_written(tmp_path):
    recs = _records()
    paths = plot(tmp_path, [summarize("stack", recs[:3], 2.0), summarize("hf", recs[3:], 2.0)],
                 recs, "test")
    assert [p.name for p in paths] == ["ttft.png", "throughput.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
