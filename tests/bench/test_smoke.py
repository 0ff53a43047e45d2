"""``radixmesh bench --quick`` end to end: it runs and its records are consistent (not speed)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]


def test_quick_bench_writes_consistent_records(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "radixmesh.cli", "bench", "--quick", "--workload", "handbook",
         "--systems", "radixmesh,hf-generate", "--hf-requests", "2", "--threads", "2",
         "--no-progress", "--output-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    [run_dir] = tmp_path.iterdir()
    body = json.loads((run_dir / "results.json").read_text())
    assert body["meta"]["problems"] == []
    requests = body["meta"]["workload"]["info"]["requests"]
    records = body["records"]
    stack = [r for r in records if r["system"] == "radixmesh"]
    hf = [r for r in records if r["system"] == "hf-generate"]
    assert len(stack) == requests and len(hf) == 2
    for r in stack + hf:
        assert r["error"] is None
        assert 0 < r["ttft_s"] <= r["e2e_s"]
        assert r["completion_tokens"] == r["stream_tokens"] >= 1
        assert len(r["itl_s"]) == r["completion_tokens"] - 1
        assert r["prompt_tokens"] == r["client_prompt_tokens"]
        assert 0 <= r["cached_tokens"] <= r["prompt_tokens"]
    assert all(r["worker"] for r in stack) and all(r["worker"] is None for r in hf)
    by_id = {r["id"]: r for r in stack}
    for r in stack:  # a follow-up was sent only after its parents had finished
        for parent in r["depends_on"]:
            assert r["start_s"] >= by_id[parent]["start_s"] + by_id[parent]["e2e_s"] - 1e-3
    summaries = {s["system"]: s for s in body["summaries"]}
    assert set(summaries) == {"radixmesh", "hf-generate"}
    assert 0 <= summaries["radixmesh"]["worker_idle"] < 1
    assert summaries["hf-generate"]["worker_idle"] is None  # no worker: unknown, not 0
    for name in ("ttft.png", "throughput.png"):
        assert (run_dir / name).read_bytes()[:4] == b"\x89PNG"
    assert "| radixmesh |" in (run_dir / "table.md").read_text()
    assert "| radixmesh |" in out.stdout
