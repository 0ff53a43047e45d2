"""The launcher's log folder holds one run: at start the previous run's logs and spans move
to ``<log_dir>/previous/`` (the run before that is dropped), so ``spans.jsonl`` does not
grow across runs and a worker log of a run with more workers does not linger."""

from __future__ import annotations

import shutil
from pathlib import Path

PREVIOUS = "previous"
RUN_FILES = ("*.log", "spans.jsonl")  # NOTE: only what a run writes; other files stay


def start_run(log_dir: Path) -> list[Path]:
    """Make ``log_dir`` (if needed) and move the last run's files into ``previous/``;
    returns where they went. Nothing moves when the folder holds no run."""
    log_dir.mkdir(parents=True, exist_ok=True)
    files = sorted({p for pattern in RUN_FILES for p in log_dir.glob(pattern) if p.is_file()})
    if not files:
        return []
    previous = log_dir / PREVIOUS
    shutil.rmtree(previous, ignore_errors=True)
    previous.mkdir()
    moved = []
    for path in files:
        moved.append(path.replace(previous / path.name))
    return moved
