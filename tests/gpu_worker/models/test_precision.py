"""``--dtype auto``: bf16 where the hardware computes it natively, fp32 elsewhere (bf16 weights\nwhere AVX2 widens them)."""

from __future__ import annotations

import pytest

from services.gpu_worker.models.precision import cpu_flags, resolve_dtype, resolve_kv_dtype

SAPPHIRE_RAPIDS = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
ZEN3 = frozenset({"avx2", "fma", "sse4_2"})


def test_auto_on_the_cpu_follows_the_bf16_flags():
    assert resolve_dtype("auto", "cpu", SAPPHIRE_RAPIDS).name == "bfloat16"
    assert "amx_bf16" in resolve_dtype("auto", "cpu", SAPPHIRE_RAPIDS).reason
    assert resolve_dtype("auto", "cpu", frozenset({"avx512f", "avx512_bf16"})).name == "bfloat16"
    assert resolve_dtype("auto", "cpu", ZEN3).name == "float32"
    assert resolve_dtype("auto", "cpu", frozenset()).name == "float32"


def test_auto_without_native_bf16_keeps_fp32_with_bf16_weights_where_avx2_widens_them():
    assert resolve_dtype("auto", "cpu", ZEN3) == ("float32", resolve_dtype("auto", "cpu", ZEN3).reason, True)
    assert "bf16" in resolve_dtype("auto", "cpu", ZEN3).reason
    assert not resolve_dtype("auto", "cpu", frozenset({"sse4_2"})).bf16_weights  # no AVX2: fp32 weights
    assert not resolve_dtype("auto", "cpu", SAPPHIRE_RAPIDS).bf16_weights  # bf16 throughout there
    assert not resolve_dtype("float32", "cpu", ZEN3).bf16_weights  # fp32 asked for: every weight fp32


def test_auto_on_cuda_is_bf16_and_explicit_names_win():
    assert resolve_dtype("auto", "cuda", ZEN3).name == "bfloat16"
    assert resolve_dtype("float32", "cpu", SAPPHIRE_RAPIDS) == ("float32", "asked for", False)
    assert resolve_dtype("bfloat16", "cpu", ZEN3).name == "bfloat16"
    with pytest.raises(ValueError, match="float16"):
        resolve_dtype("float16", "cpu")


def test_cpu_flags_reads_the_first_processor(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16 amx_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(info) == {"fpu", "avx512_bf16", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_the_runner_keeps_the_resolved_dtype(runner):
    assert runner.config.dtype == "float32" and runner.dtype_choice.reason == "asked for"
    auto = resolve_dtype("auto", "cpu")
    assert auto.name == ("bfloat16" if {"amx_bf16", "avx512_bf16"} & cpu_flags() else "float32")


def test_kv_dtype_auto_is_bf16_under_bf16_weights_else_the_models():
    assert resolve_kv_dtype("auto", resolve_dtype("auto", "cpu", ZEN3)).name == "bfloat16"
    assert resolve_kv_dtype("auto", resolve_dtype("auto", "cpu", SAPPHIRE_RAPIDS)).name == "bfloat16"
    assert resolve_kv_dtype("auto", resolve_dtype("float32", "cpu", ZEN3)).name == "float32"  # parity: fp32 KV
    assert resolve_kv_dtype("auto", resolve_dtype("auto", "cpu", frozenset({"sse4_2"}))).name == "float32"
    assert resolve_kv_dtype("bfloat16", resolve_dtype("float32", "cpu", ZEN3))[:2] == ("bfloat16", "asked for")


def test_kv_dtype_refuses_unknown_names_and_more_precision_than_the_model():
    with pytest.raises(ValueError, match="not one of"):
        resolve_kv_dtype("fp8", resolve_dtype("auto", "cpu", ZEN3))
    with pytest.raises(ValueError, match="under a bfloat16 model"):
        resolve_kv_dtype("float32", resolve_dtype("bfloat16", "cpu", ZEN3))
