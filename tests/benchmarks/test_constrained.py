"""The constrained-decoding benchmark runs end to end at a tiny size (numbers not checked)."""

from __future__ import annotations

import re

import pytest

from radixmesh.benchmarks import constrained

pytestmark = pytest.mark.slow


def test_tiny_run_prints_three_consistent_tables(capsys):
    constrained.main(["--batches", "1", "2", "--steps", "2", "--rounds", "1", "--threads", "1"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    cells = [re.split(r"(?<!\\)\|", r) for r in rows]  # NOTE: "\|" is a pipe inside a cell
    compiled = [c for c in cells if len(c) == 7 and "`" in c[2]]
    assert len(compiled) == len(constrained.PATTERNS)
    for row in compiled:  # states and table size are positive numbers
        states, mb = row[4:6]
        assert int(states) > 0 and float(mb) > 0
    ratios = [r for r in rows if re.match(r"\| \d+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|", r)]
    assert [int(r.split("|")[1]) for r in ratios] == [1, 2]
    joins = [r for r in rows if "announced ahead" in r or "in the step" in r]
    assert len(joins) == len(constrained.JOIN_PATTERNS)
