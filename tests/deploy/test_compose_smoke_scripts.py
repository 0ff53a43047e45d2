"""The compose smoke's checks (scripts/compose_smoke_check.py, scripts/compose_bench_compare.py)
read what the code really writes: the kernels' start line and warnings, bench's results.json."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path

from libs.kernels import cpu_ext

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


check = _script("compose_smoke_check")
compare = _script("compose_bench_compare")


def test_the_kernel_line_matches_what_a_worker_logs(caplog):
    cpu_ext._default.cache_clear()
    with caplog.at_level(logging.INFO, logger=cpu_ext.log.name):
        cpu_ext._default()
    lines = [r.getMessage() for r in caplog.records if "cpu kernels" in r.getMessage()]
    assert lines, "cpu_ext logged no start line"
    best = cpu_ext.best_level()
    if best in cpu_ext.built_levels():
        assert any(check.KERNELS_LINE.search(line) and check.KERNELS_LINE.search(line).group(1) == best
                   for line in lines), lines
    assert check.KERNELS_WARNING.search("cpu kernels: running avx2, below this CPU's best (avx512): slower")
    assert check.KERNELS_WARNING.search("cpu kernels: none could be loaded: the cpu backend is unavailable")
    assert not check.KERNELS_WARNING.search("cpu kernels: avx512bf16 (of avx2, avx512, avx512bf16)")


def _results(path: Path, tok_s: float, failed: int = 0) -> Path:
    path.write_text(json.dumps({"summaries": [{"output_throughput": tok_s, "ttft_p50_ms": 100.0,
                                               "tpot_p50_ms": 20.0, "completed": 16, "failed": failed}]}))
    return path


def test_compare_fails_only_beyond_the_tolerance(tmp_path, capsys):
    local = [_results(tmp_path / "l1.json", 100.0), _results(tmp_path / "l2.json", 90.0)]
    args = ["--local", *map(str, local), "--compose"]
    assert compare.main([*args, str(_results(tmp_path / "c1.json", 91.0))]) == 0
    assert compare.main([*args, str(_results(tmp_path / "c2.json", 89.0))]) == 1
    assert "compose/local 0.890" in capsys.readouterr().out
    try:
        compare.main([*args, str(_results(tmp_path / "c3.json", 95.0, failed=2))])
    except SystemExit as exc:
        assert "2 requests failed" in str(exc)
    else:
        raise AssertionError("a round with failed requests must fail the comparison")
