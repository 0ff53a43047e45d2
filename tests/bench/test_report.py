import json
import math

import pytest

from radixmesh.bench.record import Record
from radixmesh.bench.report import class_table, markdown_table, pd_goals, plot, tier_goals, write_json
from radixmesh.bench.stats import summarize, summarize_by_kind


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


def _two_classes(system, tpot_s, tput_tokens):
    streams = [Record(system, f"s{i}", "stream", ttft_s=0.1, e2e_s=0.1 + 9 * tpot_s * (i + 1),
                      completion_tokens=10, itl_s=[tpot_s * (i + 1)] * 9) for i in range(3)]
    docs = [Record(system, "d0", "document", ttft_s=2.0, e2e_s=2.0,
                   completion_tokens=tput_tokens)]
    return streams + docs


def test_class_table_keeps_streams_apart_from_documents(tmp_path):
    recs = _two_classes("stack", 0.1, 1)
    classes = summarize_by_kind("stack", recs, 2.0)
    assert [k for k, _ in classes] == ["stream", "document"]
    stream = classes[0][1]
    assert stream.tpot_p50_ms == pytest.approx(200) and stream.tpot_p99_ms == pytest.approx(298)
    assert classes[1][1].ttft_p50_ms == pytest.approx(2000)
    lines = class_table(classes).splitlines()
    assert "| class |" in lines[0] and "TPOT p99 (ms)" in lines[0]
    assert lines[2].startswith("| stack | stream | 3/0 | 15.0 | 100 | 100 | 200.0 | 298.0 |")
    assert lines[3].startswith("| stack | document | 1/0 | 0.5 | 2000 | 2000 | - | - |")
    write_json(tmp_path / "r.json", {}, [summarize("stack", recs, 2.0)], recs, classes)
    body = json.loads((tmp_path / "r.json").read_text())
    assert [c["class"] for c in body["class_summaries"]] == ["stream", "document"]


def test_pd_goals_compare_stream_tpot_p99_and_total_throughput():
    base, pd = _two_classes("base", 0.2, 1), _two_classes("pd", 0.05, 1)
    summaries = [summarize("base", base, 2.0), summarize("pd", pd, 2.0)]
    classes = summarize_by_kind("base", base, 2.0) + summarize_by_kind("pd", pd, 2.0)
    [line] = pd_goals(summaries, classes, "base", "pd", "stream")
    assert "TPOT p99 0.25x" in line and "goal <= 0.5x: met" in line
    assert "throughput 1.00x (goal >= 0.9x: met)" in line
    slow = [summarize("base", base, 2.0), summarize("pd", pd, 4.0)]
    assert "0.50x (goal >= 0.9x: not met)" in pd_goals(slow, classes, "base", "pd", "stream")[0]
    assert pd_goals(summaries[:1], classes, "base", "pd", "stream") == []


def _tiered(system, ttft_s, cached):
    return summarize(system, [Record(system, f"r{i}", "question", ttft_s=ttft_s, e2e_s=ttft_s + 1,
                                     completion_tokens=2, prompt_tokens=100, cached_tokens=cached)
                              for i in range(4)], 10.0)


def test_tier_goals_compare_hit_rate_with_the_ideal_and_ttft_with_tiers_off():
    off, host, store = _tiered("radixmesh", 2.0, 5), _tiered("radixmesh-host-tier", 0.2, 60), \
        _tiered("radixmesh-store-tier", 0.4, 70)
    lines = tier_goals([off, host, store], "radixmesh", ["radixmesh-host-tier", "radixmesh-store-tier"], 0.64)
    assert len(lines) == 2
    assert lines[0].startswith("radixmesh-host-tier / radixmesh: cache hit 60.0% = 0.94x the workload's "
                               "ideal 64.0% (goal >= 0.9x: met), TTFT p50 0.10x (goal <= 0.15x: met)")
    assert "1.09x" in lines[1] and "TTFT p50 0.20x (goal <= 0.15x: not met)" in lines[1]
    assert tier_goals([host], "radixmesh", ["radixmesh-host-tier"], 0.64) == []  # no tiers-off run
    assert tier_goals([off, host], "radixmesh", ["radixmesh-host-tier"], 0.0) == []  # no ideal
