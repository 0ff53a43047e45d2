"""The C++ kernels' builds: one per ISA level, keyed by what it depends on (never the CPU), the
level a CPU loads, and loading a built level without a compiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from libs.kernels import BackendNotAvailable, cpu_ext


def test_build_folders_are_keyed_by_sources_headers_level_and_torch_not_by_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXMESH_EXT_DIR", str(tmp_path / "ext"))
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "kernel.cpp").write_text("int f() { return 1; }\n")
    (csrc / "vec.h").write_text("#pragma once\n")
    monkeypatch.setattr(cpu_ext, "CSRC", csrc)
    first = cpu_ext.build_dir("avx2")
    assert first.parent == tmp_path / "ext" and not first.exists()  # NOTE: made by a build, not by asking
    assert first.name.endswith("-avx2-torch" + torch.__version__.replace("+", "_"))
    assert cpu_ext.build_dir("avx2") == first  # stable while nothing changes
    levels = {cpu_ext.build_dir(name) for name in cpu_ext.LEVELS}
    monkeypatch.setattr(cpu_ext, "cpu_flags", lambda: frozenset({"fpu", "sse2"}))  # another CPU: the same folders
    assert {cpu_ext.build_dir(name) for name in cpu_ext.LEVELS} == levels and len(levels) == len(cpu_ext.LEVELS)
    (csrc / "kernel.cpp").write_text("int f() { return 2; }\n")
    edited = cpu_ext.build_dir("avx2")
    (csrc / "vec.h").write_text("#pragma once\n// changed\n")
    header = cpu_ext.build_dir("avx2")
    monkeypatch.setattr(cpu_ext, "FLAGS", (*cpu_ext.FLAGS, "-DX"))
    flagged = cpu_ext.build_dir("avx2")
    # another venv: torch's ninja file names its headers, so sharing would rebuild at each switch
    monkeypatch.setattr(cpu_ext, "_torch_paths", lambda: "/other/.venv/site-packages/torch")
    other_venv = cpu_ext.build_dir("avx2")
    assert len({first, edited, header, flagged, other_venv}) == 5


def test_no_level_is_built_for_the_cpu_that_builds_it():
    """Nothing of the building machine's own goes into a build: no -march/-mtune=native, and
    each level's flags enable no more than the CPU flags it asks for."""
    for name, level in cpu_ext.LEVELS.items():
        flags = cpu_ext._cflags(name)
        assert not any("native" in flag or flag.startswith("-march") for flag in flags), name
        enabled = {flag.removeprefix("-m").replace("avx512bf16", "avx512_bf16") for flag in level.cflags}
        assert enabled == set(level.needs), name


@pytest.mark.parametrize("cpu, levels", [
    ("fpu sse2 sse4_2 avx", []),  # no AVX2: none
    ("avx avx2 fma f16c bmi2", ["avx2"]),  # Zen 3, Haswell .. Alder Lake
    ("avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512cd", ["avx2", "avx512"]),  # Skylake-X, Ice Lake
    ("avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_bf16", ["avx2", "avx512", "avx512bf16"]),  # Zen 4
    ("avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_tile amx_bf16",
     ["avx2", "avx512", "avx512bf16"]),  # Sapphire Rapids: AMX through oneDNN at run time
    ("avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16", []),  # no F16C: none (a VM hiding flags)
])
def test_the_levels_a_cpu_runs_and_its_best(cpu, levels):
    flags = frozenset(cpu.split())
    assert cpu_ext.runnable_levels(flags) == levels
    assert cpu_ext.best_level(flags) == (levels[-1] if levels else None)


def test_cpu_flags_come_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_ext.cpu_flags(info) == {"fpu", "avx2", "fma"}
    assert cpu_ext.cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.parametrize("name", cpu_ext.runnable_levels())
def test_each_level_is_built_for_its_isa(name):
    """Each build has its level's extensions and no more (the CPU flags' names), and the kernels
    that need more report themselves unbuilt."""
    module = cpu_ext.load(name)
    assert module.__name__ == f"radixmesh_cpu_kernels_{name}"
    assert set(module.isa().split()) == set(cpu_ext.LEVELS[name].needs)
    assert bool(module.gemm_bf16()) == (name == "avx512bf16")
    assert bool(module.gemm_f32())
    assert bool(module.fp32_extend()) == (name == "avx2")  # extend_avx2.h: the AVX2-only build's


def test_using_a_level_routes_every_load_to_it():
    levels = cpu_ext.runnable_levels()
    if not levels:
        pytest.skip("no level runs on this CPU")
    default = cpu_ext.load()
    with cpu_ext.using(levels[0]) as module:
        assert cpu_ext.load() is module is cpu_ext.load(levels[0])
        assert cpu_ext.loaded_level() == cpu_ext.best_level()  # the process's own level is unchanged
    assert cpu_ext.load() is default
    with pytest.raises(BackendNotAvailable, match="unknown cpu kernel level"):
        cpu_ext.load("avx9000")


def test_a_level_this_cpu_cannot_execute_is_never_imported(monkeypatch):
    monkeypatch.setattr(cpu_ext, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))  # a Zen 3
    cpu_ext._load.cache_clear()
    try:
        with pytest.raises(BackendNotAvailable, match="cannot execute the avx512bf16 build .it lacks avx512_bf16, "
                                                      "avx512bw, avx512dq, avx512f, avx512vl"):
            cpu_ext.load("avx512bf16")
    finally:
        cpu_ext._load.cache_clear()  # NOTE: the modules stay in sys.modules: the next load finds them there


def test_the_best_level_this_cpu_runs_is_the_one_loaded():
    """CI=true: a CPU kind whose best build fails (or is missing) cannot pass by running a lower
    level or the torch fallback. Elsewhere, only a machine where nothing builds skips."""
    best = cpu_ext.best_level()
    if best is None:
        pytest.skip("this CPU runs no level (no AVX2 + FMA + F16C): the torch fallback is all there is")
    if os.environ.get("RADIXMESH_CPU_KERNELS"):
        pytest.skip("RADIXMESH_CPU_KERNELS picks the level by hand")
    if cpu_ext.loaded_level() is None and not os.environ.get("CI"):
        pytest.skip(f"the C++ kernels do not build here: {cpu_ext.describe()}")
    assert cpu_ext.loaded_level() == best, cpu_ext.describe()
    assert cpu_ext.load() is cpu_ext.load(best)


@pytest.mark.parametrize("name", list(cpu_ext.LEVELS))
def test_every_level_is_built_even_those_this_cpu_cannot_run(name):
    """CI=true builds each level (install has, so this is a check); elsewhere a level not built is
    skipped. A level above this CPU's is not imported: its library is checked for its module."""
    if not cpu_ext.is_built(name):
        if not os.environ.get("CI"):
            pytest.skip(f"{name} is not built (python -m libs.kernels.cpu_ext builds every level)")
        cpu_ext.build(name)
    assert cpu_ext.is_built(name)
    stamp = json.loads((cpu_ext.build_dir(name) / cpu_ext.READY).read_text())
    assert stamp["level"] == name and stamp["cflags"] == list(cpu_ext._cflags(name))
    assert f"PyInit_radixmesh_cpu_kernels_{name}".encode() in cpu_ext.library(name).read_bytes()
    if name in cpu_ext.runnable_levels():
        assert cpu_ext.load(name).isa()


def test_the_private_torch_build_step_takes_what_build_passes():
    """build() calls torch's build step without its import (torch 2.13's private function): a torch
    upgrade that changes it must fail here, not in a user's first start."""
    import inspect

    from torch.utils import cpp_extension

    params = inspect.signature(cpp_extension._write_ninja_file_and_build_library).parameters
    assert {"name", "sources", "extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags",
            "extra_include_paths", "build_directory", "verbose", "with_cuda", "with_sycl"} <= set(params)


def test_build_all_builds_the_missing_levels_side_by_side(monkeypatch):
    built, jobs = [], []

    def fake_build(name):
        jobs.append(os.environ.get("MAX_JOBS"))
        if name == "avx512":
            raise RuntimeError("no -mavx512f in this compiler")
        built.append(name)

    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(cpu_ext, "is_built", lambda name: name == "avx2")
    monkeypatch.setattr(cpu_ext, "build", fake_build)
    results = cpu_ext.build_all(jobs=4)
    assert list(results) == list(cpu_ext.LEVELS) and results["avx2"] == 0.0
    assert isinstance(results["avx512"], RuntimeError) and isinstance(results["avx512bf16"], float)
    assert built == ["avx512bf16"] and jobs == ["2", "2"]  # 4 compiles over the 2 levels to build
    assert "MAX_JOBS" not in os.environ


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=cpu_ext.CSRC.parents[2], env={**os.environ, **env})


def test_a_built_level_loads_without_a_compiler_and_says_which(tmp_path):
    """What the image does: no c++, no ninja on the PATH; the level is imported from its folder
    and logged once."""
    best = cpu_ext.best_level()
    if best is None or not cpu_ext.is_built(best):
        pytest.skip("this CPU's best level is not built")
    code = ("import logging; logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
            "from libs.kernels import cpu_ext, default_backend\n"
            "assert cpu_ext.describe() == 'not loaded'\n"
            "backend = default_backend('cpu')\n"
            "print(cpu_ext.describe(), backend)\n")
    out = _python(code, PATH=str(tmp_path), CXX=str(tmp_path / "c++"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{best} (of {', '.join(cpu_ext.built_levels())}) cpu"
    assert out.stderr.count("cpu kernels: ") == 1 and f"cpu kernels: {best} (of " in out.stderr


def test_a_level_that_is_not_built_and_cannot_be_is_a_loud_warning_with_its_cost(tmp_path):
    if cpu_ext.best_level() is None:
        pytest.skip("this CPU runs no level")
    code = ("from libs.kernels import cpu_ext, default_backend\n"
            "print(default_backend('cpu')); print(cpu_ext.describe())\n")
    out = _python(code, PATH=str(tmp_path), CXX=str(tmp_path / "c++"), RADIXMESH_EXT_DIR=str(tmp_path / "empty"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "torch" and out.stdout.splitlines()[1].startswith("none (")
    assert "not built ahead of time" in out.stderr and "0.6-0.7x" in out.stderr


def test_radixmesh_cpu_kernels_picks_a_lower_level():
    levels = cpu_ext.runnable_levels()
    if len(levels) < 2 or not cpu_ext.is_built(levels[0]):
        pytest.skip("needs two levels this CPU runs, the lowest built")
    code = "from libs.kernels import cpu_ext\nprint(cpu_ext.loaded_level())\n"
    assert _python(code, RADIXMESH_CPU_KERNELS=levels[0]).stdout.strip() == levels[0]
    out = _python(code, RADIXMESH_CPU_KERNELS="avx9000")
    assert out.stdout.strip() == "None" and "0.6-0.7x" in out.stderr


def test_the_sources_it_builds_exist():
    assert all((cpu_ext.CSRC / name).is_file() for name in cpu_ext.SOURCES)


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    from libs.kernels.cpu_ext import STALE_LOCK_S, clear_stale_lock

    lock = tmp_path / "lock"
    assert not clear_stale_lock(tmp_path)
    lock.write_text("")
    assert not clear_stale_lock(tmp_path) and lock.exists()  # a build may be running
    assert clear_stale_lock(tmp_path, now=lock.stat().st_mtime + STALE_LOCK_S + 1)
    assert not lock.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_a_build_killed_while_it_held_the_lock_hangs_no_later_start(tmp_path):
    """A worker stopped during its first compile leaves torch's ``lock`` file behind; the next
    load must not wait for it (torch's own wait never ends)."""
    code = ("import sys, time\nfrom pathlib import Path\nfrom libs.kernels.cpu_ext import build_lock\n"
            "d = Path(sys.argv[1])\nwith build_lock(d):\n    (d / 'lock').write_text('')\n"
            "    print('building', flush=True)\n    time.sleep(60)\n")
    builder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                               text=True, cwd=cpu_ext.CSRC.parents[2])
    try:
        assert builder.stdout.readline().strip() == "building"
        entered = threading.Event()

        def load_after() -> None:
            with cpu_ext.build_lock(tmp_path):
                entered.set()

        waiter = threading.Thread(target=load_after, daemon=True)
        waiter.start()
        assert not entered.wait(0.5)  # a live build holds it: the next one waits
        builder.kill()
        builder.wait()
        assert entered.wait(10)  # the kernel released the dead builder's lock
        assert not (tmp_path / "lock").exists()  # and torch's leftover lock file is gone
    finally:
        builder.kill()
