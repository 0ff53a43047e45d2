"""run_session over fake systems: the per-class and transfer tables, a system that fails."""

import argparse
import json

import pytest

from radixmesh.bench import session
from radixmesh.bench.cli import add_arguments
from radixmesh.bench.record import Record
from radixmesh.bench.systems import BenchError, RunResult
from radixmesh.bench.transfers import Transfers


def _args(tmp_path, systems: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--workload", "pd-mix", "--quick", "--workers", "2", "--threads", "1",
                         "--systems", systems, "--no-plots", "--no-progress",
                         "--output-dir", str(tmp_path)])


def _fake_run(plan, args, workload, tok, model_dir, out_dir):
    if plan.name == "radixmesh-no-overlap":
        raise BenchError(f"{plan.name}: stack not healthy")
    records = [Record(plan.name, s.id, s.kind, ttft_s=0.5, e2e_s=1.5, completion_tokens=5,
                      itl_s=[0.25] * 4, prompt_tokens=10) for s in workload.requests]
    moved = Transfers(len(records), len(records), 10**7, 1.0) if plan.stack else Transfers()
    return RunResult(records, 2.0, 0.0, moved)


def test_pd_run_writes_class_and_transfer_tables_and_survives_a_failed_system(
        tmp_path, monkeypatch):
    monkeypatch.setattr(session, "_run_system", _fake_run)
    code = session.run_session(_args(tmp_path, "radixmesh,radixmesh-no-overlap,radixmesh-pd"))
    assert code == 1  # one system did not run
    [run_dir] = tmp_path.iterdir()
    table = (run_dir / "table.md").read_text()
    assert "| radixmesh-pd | stream | 2/0 |" in table and "| radixmesh | document | 2/0 |" in table
    assert "| radixmesh-pd | 1 prefill + 1 decode | 4/4 | 10.0 | 2.5 | 250 | 0 |" in table
    assert "stream TPOT p99 1.00x (goal <= 0.5x: not met)" in table
    assert "| 0.0% | cold |" in table  # a stack of the harness's starts with an empty cache
    assert "ceilings (measured in this run, 1 threads" in table
    body = json.loads((run_dir / "results.json").read_text())
    meta = body["meta"]
    assert meta["not_run"] == ["radixmesh-no-overlap"]
    assert meta["layouts"] == {"radixmesh": "2 colocated", "radixmesh-no-overlap": "2 colocated",
                               "radixmesh-pd": "1 prefill + 1 decode"}
    assert meta["transfers"]["radixmesh-pd"]["received"] == 4
    assert [s["system"] for s in body["summaries"]] == ["radixmesh", "radixmesh-pd"]


def test_stacks_run_the_dtype_radixmesh_up_runs_unless_told():
    p = argparse.ArgumentParser()
    add_arguments(p)
    dtype = next(a for a in p._actions if a.dest == "dtype")
    assert dtype.default == "auto" and list(dtype.choices) == ["auto", "float32", "bfloat16"]
    assert p.parse_args(["--dtype", "float32"]).dtype == "float32"


def test_ceilings_are_measured_at_the_dtype_auto_resolves_to(tmp_path, monkeypatch):
    import pytest
    import torch

    from radixmesh.benchmarks import ceilings
    from services.gpu_worker.models import config, precision

    class Measured(Exception):
        pass

    def measure(cfg, dtype, threads):
        raise Measured(dtype)

    monkeypatch.setattr(config.ModelConfig, "from_dir", staticmethod(lambda path: None))
    monkeypatch.setattr(ceilings, "measure", measure)
    args = _args(tmp_path, "radixmesh")
    for flags, want in ((frozenset({"avx2"}), torch.float32), (frozenset({"avx512_bf16"}), torch.bfloat16)):
        monkeypatch.setattr(precision, "cpu_flags", lambda flags=flags: flags)
        with pytest.raises(Measured) as got:
            session._ceilings(args, tmp_path)
        assert got.value.args[0] == want


def test_a_run_without_the_bench_extra_stops_before_any_system(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    ran = []
    monkeypatch.setattr(session, "_run_system", lambda *a: ran.append(a))
    args = _args(tmp_path, "radixmesh")
    args.no_plots = False
    with pytest.raises(ValueError, match=r"pip install 'radixmesh\[bench\]' \(or --no-plots\)"):
        session.run_session(args)
    assert not ran
    args.no_plots = True  # no plots: matplotlib is not needed
    session._validate(args)


def test_a_run_where_git_is_missing_records_no_commit(tmp_path, monkeypatch):
    """The service image has no git: the run goes on, its record says null."""
    monkeypatch.setattr(session, "_run_system", _fake_run)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert session.run_session(_args(tmp_path / "out", "radixmesh")) == 0
    [run_dir] = (tmp_path / "out").iterdir()
    assert json.loads((run_dir / "results.json").read_text())["meta"]["git_commit"] is None
