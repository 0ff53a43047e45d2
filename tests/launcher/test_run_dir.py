"""radixmesh/run_dir.py: the log folder holds one run; the one before is in previous/."""

from __future__ import annotations

import pytest

from radixmesh import launcher
from radixmesh.launcher import LocalStack, StackConfig
from radixmesh.run_dir import start_run


def _run(log_dir, workers: int, spans: str) -> None:
    """What a run leaves behind."""
    for name in ("gateway", "nats-server", *(f"gpu_worker-{i}" for i in range(workers))):
        (log_dir / f"{name}.log").write_text(f"{name} of {spans}\n")
    (log_dir / "spans.jsonl").write_text(spans + "\n")


def test_each_start_moves_the_last_run_to_previous_and_drops_the_one_before(tmp_path):
    assert start_run(tmp_path / "logs") == [] and (tmp_path / "logs").is_dir()
    logs = tmp_path / "logs"
    (logs / "jetstream").mkdir()  # the broker's storage, not a log: it stays
    (logs / "notes.txt").write_text("mine\n")
    _run(logs, workers=3, spans="run 1")
    assert len(start_run(logs)) == 6
    _run(logs, workers=1, spans="run 2")
    start_run(logs)
    previous = logs / "previous"
    assert sorted(p.name for p in previous.iterdir()) == [
        "gateway.log", "gpu_worker-0.log", "nats-server.log", "spans.jsonl"]
    assert (previous / "spans.jsonl").read_text() == "run 2\n"  # run 1 is gone
    assert sorted(p.name for p in logs.iterdir()) == ["jetstream", "notes.txt", "previous"]


def test_the_stack_starts_a_fresh_run_folder(tmp_path, monkeypatch):
    """LocalStack.start itself (stopped right after, at the model): no worker log of a
    run with more workers and no spans of an earlier run are left in the folder."""
    _run(tmp_path, workers=2, spans="earlier")

    def no_model(*args, **kwargs):
        raise RuntimeError("stop here")

    monkeypatch.setattr(launcher, "resolve_model", no_model)
    with pytest.raises(RuntimeError, match="stop here"):
        LocalStack(StackConfig(port=0, log_dir=tmp_path), progress=lambda _: None).start()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["previous"]
    assert (tmp_path / "previous" / "gpu_worker-1.log").exists()
