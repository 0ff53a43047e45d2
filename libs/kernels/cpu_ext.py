"""The C++ CPU kernels in ``csrc/``: built ahead of time once per ISA level, one chosen at load.

The same sources (decode, extend, the elementwise ops, the KV store, the linears, the layer
loop, the v1 decode kept as the benchmarks' baseline) are compiled once per level in
:data:`LEVELS`, each into its own shared object (``radixmesh_cpu_kernels_<level>``) with
that level's ``-m`` flags and nothing of the building machine's own (no ``-march=native``),
so a build made on one CPU runs on any CPU with the level's extensions:

- ``avx2``: AVX2, FMA, F16C (the 8-lane paths: ``decode_avx2.h``, ``extend_avx2.h``,
  ``gemm_f32.cpp``, rows.h's AVX2 rows);
- ``avx512``: + AVX-512 F/BW/VL/DQ (16-lane rows, decode's AVX-512 loops);
- ``avx512bf16``: + AVX512-BF16 (the dot-instruction paths: ``decode_bf16.h``,
  ``dot_tiles.h``, ``gemm_bf16.cpp``). AMX needs no level of its own: extend's bf16
  products reach it through oneDNN's brgemm, which checks the CPU when it runs.

``python -m libs.kernels.cpu_ext`` (scripts/install.sh, the image's build stage) builds every
level the compiler can, in parallel; a level already built is not touched, so a second run
is a no-op. :func:`load` picks the best level the CPU's flags (``/proc/cpuinfo``) allow,
logs it once ("cpu kernels: avx512bf16 (of avx2, avx512, avx512bf16)") and imports its
shared object straight from its folder: no compiler is needed at run time. Where that
level is not built (sources edited since the install), it is compiled there and then (a
minute or two on 2 cores), with a warning; where it cannot be, the next level down loads,
and with none the ``cpu`` backend is unavailable and the worker runs the torch backend: both
loud warnings naming the cost. ``RADIXMESH_CPU_KERNELS=<level>`` picks a lower level by
hand; ``load(level=...)`` loads a given one (the tests run every level the CPU can execute).

Each level's folder under ``$RADIXMESH_EXT_DIR`` (default ``~/.cache/radixmesh/torch_extensions``)
is keyed by what its build depends on: the sources and headers, the level's flags, the torch
version and where torch and Python's headers are (``<hash>-<level>-torch<version>``), never by
the CPU. The build reads a copy of the sources in that folder (checkouts with the same
sources share it); one process builds a folder at a time (:func:`build_lock`), and a
``ready`` stamp, written last, marks a finished one.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterator

from .errors import BackendNotAvailable

log = logging.getLogger("radixmesh.kernels")
CSRC = Path(__file__).parent / "csrc"
SOURCES = ["module.cpp", "decode.cpp", "extend.cpp", "decode_v1.cpp", "ops.cpp", "rope.cpp", "gemm_bf16.cpp", "gemm_f32.cpp", "kv_store.cpp", "layer_loop.cpp"]
NAME = "radixmesh_cpu_kernels"
# fast-math lets the reductions vectorise (the softmax's exp is our own, vec.h); 512-bit
# vectors where the level has them (GCC prefers 256 on some CPUs that do). Compile
# flags only: the link does not pull in crtfastmath, so the process's FP mode is untouched.
FLAGS = ("-O3", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp")
# NOTE: -fopenmp links libgomp.so.1 by soname: the loader binds it to the copy torch already
# loaded (torch/lib/libgomp.so.1), so at::parallel_for here runs on torch's thread team and
# follows torch.set_num_threads. Without it the kernels' parallel_for loops ran serially.
LDFLAGS = ("-lmvec", "-fopenmp")
FALLBACK_COST = "the torch fallback runs at ~0.6-0.7x the speed"
READY = "ready"  # the stamp a finished build leaves in its folder


@dataclass(frozen=True)
class Level:
    """One build: its compiler flags and the CPU flags (``/proc/cpuinfo``'s names) it needs."""

    name: str
    cflags: tuple[str, ...]
    needs: frozenset[str]


def _levels() -> dict[str, Level]:
    avx2 = Level("avx2", ("-mavx2", "-mfma", "-mf16c"), frozenset({"avx2", "fma", "f16c"}))
    avx512 = Level("avx512", (*avx2.cflags, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"),
                   avx2.needs | {"avx512f", "avx512bw", "avx512vl", "avx512dq"})
    bf16 = Level("avx512bf16", (*avx512.cflags, "-mavx512bf16"), avx512.needs | {"avx512_bf16"})
    return {level.name: level for level in (avx2, avx512, bf16)}


LEVELS = _levels()  # lowest first


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags (empty where /proc/cpuinfo is unreadable)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def runnable_levels(flags: frozenset[str] | None = None) -> list[str]:
    """The levels a CPU with ``flags`` (default: this one's) can execute, lowest first."""
    flags = cpu_flags() if flags is None else flags
    return [name for name, level in LEVELS.items() if level.needs <= flags]


def best_level(flags: frozenset[str] | None = None) -> str | None:
    """The highest level this CPU (or one with ``flags``) executes; None below AVX2 + FMA + F16C."""
    runnable = runnable_levels(flags)
    return runnable[-1] if runnable else None


# -- where each level's build lives ------------------------------------------------------

def build_key(level: str) -> str:
    """``<hash>-<level>-torch<version>``: the hash of what the level's module depends on."""
    import torch

    digest = hashlib.sha256(b"built from src/")  # NOTE: not the folders of checkouts that built from theirs
    for path in _source_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(" ".join(_cflags(level) + LDFLAGS).encode())  # NOTE: tuples: nothing appends to them
    digest.update(_torch_paths().encode())
    return f"{digest.hexdigest()[:12]}-{level}-torch{torch.__version__.replace('+', '_')}"


def _cflags(level: str) -> tuple[str, ...]:
    return FLAGS + LEVELS[level].cflags


def _source_files() -> list[Path]:
    return sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h"))


def _torch_paths() -> str:
    """Where torch and Python's headers are: torch's ninja file names them, so two venvs
    with the same sources in one folder would rebuild the module at every switch."""
    import sysconfig

    import torch

    return f"{Path(torch.__file__).parent}\0{sysconfig.get_paths()['include']}"


def ext_root() -> Path:
    return Path(os.environ.get("RADIXMESH_EXT_DIR", Path.home() / ".cache" / "radixmesh" / "torch_extensions"))


def build_dir(level: str) -> Path:
    """The level's folder (not created here: a prebuilt one may be read-only)."""
    return ext_root() / build_key(level)


def module_name(level: str) -> str:
    return f"{NAME}_{level}"


def library(level: str) -> Path:
    """The level's shared object (whether or not it is built yet)."""
    from torch.utils.cpp_extension import LIB_EXT

    return build_dir(level) / f"{module_name(level)}{LIB_EXT}"


def is_built(level: str) -> bool:
    return (build_dir(level) / READY).is_file() and library(level).is_file()


def built_levels() -> list[str]:
    return [name for name in LEVELS if is_built(name)]


def copy_sources(directory: Path) -> list[str]:
    """The sources to build, copied into ``directory/src`` (each file once: the folder's key is
    their content). torch's ninja file names sources by absolute path, so two checkouts with
    the same sources, built from where they are, would rebuild each other's module in turn."""
    src = directory / "src"
    src.mkdir(exist_ok=True)
    for path in _source_files():
        target = src / path.name
        if not target.exists():
            partial = src / f".{path.name}.{os.getpid()}"
            shutil.copyfile(path, partial)
            os.replace(partial, target)  # NOTE: atomic: a concurrent build sees the whole file or none
    return [str(src / name) for name in SOURCES]


# -- building -------------------------------------------------------------------------------

def build(level: str) -> Path:
    """Build ``level``'s shared object unless it is built (no-op then), without importing it
    (a level the CPU cannot execute is built all the same); returns its folder. Raises
    whatever the build raised (no compiler, no ninja, a compile error)."""
    from torch.utils import cpp_extension

    directory = build_dir(level)
    if is_built(level):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    with build_lock(directory):
        if is_built(level):  # NOTE: another process built it while this one waited
            return directory
        started = time.monotonic()
        # NOTE: torch's load() would import the module too, which a level above the CPU's must
        # not be: its build step alone (torch 2.13's signature; tests/kernels/test_cpu_ext.py pins it)
        cpp_extension._write_ninja_file_and_build_library(
            name=module_name(level), sources=copy_sources(directory), extra_cflags=list(_cflags(level)),
            extra_cuda_cflags=[], extra_sycl_cflags=[], extra_ldflags=list(LDFLAGS), extra_include_paths=[],
            build_directory=str(directory), verbose=False, with_cuda=False, with_sycl=False,
        )
        stamp = {"level": level, "cflags": list(_cflags(level)), "seconds": round(time.monotonic() - started, 1)}
        partial = directory / f".{READY}.{os.getpid()}"
        partial.write_text(json.dumps(stamp) + "\n")
        os.replace(partial, directory / READY)
    return directory


def build_all(levels: list[str] | None = None, jobs: int | None = None) -> dict[str, float | Exception]:
    """Build ``levels`` (default: all) side by side, ``jobs`` compiles at a time in all (default:
    the cores); per level, the seconds it took (0 when built already) or what it raised."""
    levels = list(LEVELS) if levels is None else levels
    todo = [name for name in levels if not is_built(name)]
    results: dict[str, float | Exception] = {name: 0.0 for name in levels if name not in todo}
    if not todo:
        return results
    jobs = jobs or os.cpu_count() or 1
    # NOTE: torch's ninja run reads MAX_JOBS; the levels share the cores (one compile a level
    # where there are fewer cores than levels: their long units then overlap)
    per_level = str(max(1, -(-jobs // len(todo))))

    def one(name: str) -> float | Exception:
        started = time.monotonic()
        try:
            build(name)
        except Exception as exc:  # noqa: BLE001 - reported per level by the caller
            return exc
        return time.monotonic() - started

    with _env(MAX_JOBS=os.environ.get("MAX_JOBS") or per_level), ThreadPoolExecutor(len(todo)) as pool:
        results.update(zip(todo, pool.map(one, todo)))
    return {name: results[name] for name in levels}


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


STALE_LOCK_S = 900.0  # a build here takes 1-3 minutes; a lock this old was left by a killed one


def clear_stale_lock(directory: Path, now: float | None = None) -> bool:
    """Remove a build lock older than STALE_LOCK_S: torch's builds wait for the lock file to
    go, so one left by a killed build (Ctrl-C on a first start) would hang every worker.
    (Where ``fcntl`` exists, :func:`build_lock` clears such a lock at once instead.)"""
    lock = directory / "lock"
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < STALE_LOCK_S:
        return False
    log.warning("removing a stale kernel build lock (%.0f s old): %s", age, lock)
    lock.unlink(missing_ok=True)
    return True


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """One build at a time per folder, under an ``flock`` the kernel releases when its holder
    dies: whoever holds it knows no live process is building, so a ``lock`` file of torch's
    found then was left by a killed build (a worker stopped during its first compile, before
    builds went through :func:`build`) and goes at once, instead of hanging every later start."""
    try:
        import fcntl
    except ImportError:  # NOTE: not POSIX: torch's own lock file, cleared when old
        clear_stale_lock(directory)
        yield
        return
    with open(directory / "build.flock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            if (directory / "lock").exists():
                log.warning("removing the build lock a killed build left: %s", directory / "lock")
                (directory / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


# -- loading ----------------------------------------------------------------------------------

_lock = threading.RLock()
_override: str | None = None  # :func:`using`


def load(level: str | None = None) -> ModuleType:
    """The compiled module of ``level`` (default: the level this process runs, see the module's
    docstring); raises BackendNotAvailable if it cannot load."""
    if os.environ.get("RADIXMESH_NO_CPU_EXT"):
        raise BackendNotAvailable("the cpu backend is disabled by RADIXMESH_NO_CPU_EXT")
    level = level or _override
    result = _default() if level is None else _load(level)
    if isinstance(result, BackendNotAvailable):
        raise result
    return result[1] if isinstance(result, tuple) else result


@contextlib.contextmanager
def using(level: str) -> Iterator[ModuleType]:
    """Within the block, ``load()`` (and so every kernel wrapper that calls it) gives ``level``'s
    module: for tests that run one level's kernels where the CPU loads another by default."""
    global _override
    module = load(level)
    with _lock:
        before, _override = _override, level
    try:
        yield module
    finally:
        with _lock:
            _override = before


def loaded_level() -> str | None:
    """The level this process runs (loading it if need be; a test's :func:`using` aside); None
    where none loads."""
    if os.environ.get("RADIXMESH_NO_CPU_EXT"):
        return None
    result = _default()
    return None if isinstance(result, BackendNotAvailable) else result[0]


def describe() -> str:
    """For start-up lines, without loading anything: ``avx512bf16 (of avx2, avx512, avx512bf16)``,
    ``none (why)``, or ``not loaded`` where nothing in this process has asked for the kernels."""
    if os.environ.get("RADIXMESH_NO_CPU_EXT"):
        return "none (RADIXMESH_NO_CPU_EXT)"
    if not _default.cache_info().currsize:
        return "not loaded"
    result = _default()
    if isinstance(result, BackendNotAvailable):
        return f"none ({result})"
    return f"{result[0]} (of {', '.join(built_levels())})"


def check_available(backend: str, device, dtype=None) -> None:
    """What every backend on these kernels requires: the CPU, a float dtype, the module
    built; raises BackendNotAvailable naming ``backend`` otherwise."""
    import torch

    if torch.device(device).type != "cpu":
        raise BackendNotAvailable(f"the {backend} attention backend runs on the CPU only")
    if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise BackendNotAvailable(f"the {backend} attention backend does not support {dtype}")
    load()


@functools.cache  # NOTE: a failure is cached too: it is not retried in this process
def _load(level: str) -> ModuleType | BackendNotAvailable:
    if level not in LEVELS:
        return BackendNotAvailable(f"unknown cpu kernel level {level!r}; known: {', '.join(LEVELS)}")
    if level not in runnable_levels():  # NOTE: its instructions would fault (SIGILL) in the first kernel
        return BackendNotAvailable(f"this CPU cannot execute the {level} build (it lacks "
                                   f"{', '.join(sorted(LEVELS[level].needs - cpu_flags()))})")
    with _lock:
        try:
            if not is_built(level):
                log.warning("cpu kernels: %s is not built ahead of time (scripts/install.sh builds every level); "
                            "compiling it now, a minute or two", level)
                build(level)
            return _import(level)
        except Exception as exc:  # noqa: BLE001 - no compiler, no ninja, a failed build or import
            return BackendNotAvailable(f"the C++ CPU kernels ({level}) could not be built or loaded: {exc}")


def _import(level: str) -> ModuleType:
    import torch  # noqa: F401 - NOTE: the module links libtorch, which must be loaded first

    name = module_name(level)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, library(level))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


@functools.cache
def _default() -> tuple[str, ModuleType] | BackendNotAvailable:
    """The best level this CPU executes whose module loads (``RADIXMESH_CPU_KERNELS`` may name a
    lower one); logged once, with a warning where a level below the best, or none, loads."""
    runnable = runnable_levels()
    wanted = os.environ.get("RADIXMESH_CPU_KERNELS")
    if wanted:
        if wanted not in runnable:
            reason = (f"RADIXMESH_CPU_KERNELS={wanted}: not a level this CPU executes "
                      f"(it executes: {', '.join(runnable) or 'none'})")
            log.warning("cpu kernels: %s; %s", reason, FALLBACK_COST)
            return BackendNotAvailable(reason)
        runnable = runnable[: runnable.index(wanted) + 1]
    if not runnable:
        reason = "this CPU lacks AVX2, FMA or F16C, the lowest level the C++ CPU kernels are built for"
        log.warning("cpu kernels: none: %s; %s", reason, FALLBACK_COST)
        return BackendNotAvailable(reason)
    failures = []
    for level in reversed(runnable):
        module = _load(level)
        if isinstance(module, BackendNotAvailable):
            failures.append(str(module))
            log.warning("cpu kernels: %s", module)
            continue
        log.info("cpu kernels: %s (of %s)", level, ", ".join(built_levels()))
        if failures:
            log.warning("cpu kernels: running %s, below this CPU's best (%s): slower kernels", level, runnable[-1])
        return level, module
    log.warning("cpu kernels: none could be loaded: the cpu backend is unavailable; %s", FALLBACK_COST)
    return BackendNotAvailable("; ".join(failures))


# -- python -m libs.kernels.cpu_ext (scripts/install.sh, the image's build stage) ----------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m libs.kernels.cpu_ext", description="build the C++ CPU kernels, "
                                "every ISA level (a no-op where built), then load this CPU's best")
    p.add_argument("--levels", nargs="+", choices=list(LEVELS), default=list(LEVELS))
    p.add_argument("--jobs", type=int, default=None, help="compiles at a time over all levels (default: the cores)")
    p.add_argument("--strict", action="store_true", help="exit 1 unless every level built (the image's build)")
    p.add_argument("--no-load", action="store_true", help="build only (a build stage that runs on another CPU)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if os.environ.get("RADIXMESH_NO_CPU_EXT"):
        print("cpu kernels: skipped (RADIXMESH_NO_CPU_EXT)")
        return 0
    if platform.machine().lower() not in ("x86_64", "amd64"):
        print(f"WARNING: cpu kernels: none for {platform.machine()} (x86-64 only): the torch fallback runs "
              f"({FALLBACK_COST})", file=sys.stderr)
        return 0
    todo = [name for name in args.levels if not is_built(name)]
    if todo:
        print(f"cpu kernels: building {', '.join(todo)} (a minute or two each on 2 cores, side by side) ...",
              flush=True)
    started = time.monotonic()
    results = build_all(args.levels, args.jobs)
    failed = {name: r for name, r in results.items() if isinstance(r, Exception)}
    for name, result in results.items():
        if isinstance(result, Exception):
            first = str(result).strip().splitlines()[0] if str(result).strip() else type(result).__name__
            print(f"WARNING: cpu kernels: the {name} build failed: {first}\n"
                  f"  CPUs whose best level is {name} run a lower level or the torch fallback "
                  f"({FALLBACK_COST})", file=sys.stderr)
        elif result:
            print(f"cpu kernels: {name} built in {result:.0f} s: {build_dir(name)}")
    if todo:
        print(f"cpu kernels: {len(todo) - len(set(todo) & set(failed))} of {len(todo)} built in "
              f"{time.monotonic() - started:.0f} s")
    status = 1 if args.strict and failed else 0
    if args.no_load:
        return status
    best = best_level()
    try:
        load()
    except BackendNotAvailable as exc:
        print(f"WARNING: cpu kernels unavailable here (the torch backend will be used, {FALLBACK_COST}): {exc}",
              file=sys.stderr)
        return status
    if loaded_level() != best:  # NOTE: the load logged its level and why
        print(f"WARNING: cpu kernels: this CPU's best level, {best}, did not load", file=sys.stderr)
    return status


if __name__ == "__main__":  # scripts/install.sh builds every level ahead of the first worker
    sys.exit(main())
