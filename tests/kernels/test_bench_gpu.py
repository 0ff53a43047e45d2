"""The prepared GPU benchmark, exercised on its quick CPU path."""

from __future__ import annotations

from libs.kernels import bench_gpu


def test_quick_cpu_run_checks_and_times_every_table(capsys):
    assert bench_gpu.main(["--quick", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "copy ceiling:" in text and "| torch | " in text and "all checks ok" in text
    decode_rows = [line for line in text.splitlines() if line.startswith("| 4 | 256 | torch |")]
    extend_rows = [line for line in text.splitlines() if line.startswith("| 2 | 64 | 16 | torch |")]
    assert len(decode_rows) == 1 and len(extend_rows) == 1


def test_a_wrong_result_fails_the_run(monkeypatch, capsys):
    real = bench_gpu.reference_attention
    monkeypatch.setattr(bench_gpu, "reference_attention", lambda *a: real(*a) * 1.01)
    assert bench_gpu.main(["--quick", "--device", "cpu"]) == 1
    assert "FAIL" in capsys.readouterr().out
