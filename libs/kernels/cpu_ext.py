"""Build (once, cached) and load the C++ CPU kernels in ``csrc/``.

The first use compiles the sources in ``csrc/`` (decode, extend, RMSNorm (with the
residual add), SiLU-mul and RoPE, the v1 decode kept as the benchmarks' baseline) with the machine's C++ compiler through
``torch.utils.cpp_extension`` (a minute or two on 2 cores); later processes load
the cached build from a folder keyed by the kernels' sources and headers, their
flags, the CPU's feature flags (the build targets ``-march=native``) and the torch
version and its location under ``$RADIXMESH_EXT_DIR`` (default
``~/.cache/radixmesh/torch_extensions``), so checkouts and venvs sharing a machine never
rebuild each other's kernel (the build
reads a copy of the sources in that folder: checkouts with the same sources share it). One
process builds or loads a folder at a time (:func:`build_lock`). Without a compiler the ``cpu``
backend is simply unavailable and the worker falls back to ``torch``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import time
from pathlib import Path
from types import ModuleType
from typing import Iterator

from .errors import BackendNotAvailable

log = logging.getLogger("radixmesh.kernels")
CSRC = Path(__file__).parent / "csrc"
SOURCES = ["module.cpp", "decode.cpp", "extend.cpp", "decode_v1.cpp", "ops.cpp", "rope.cpp", "gemm_bf16.cpp", "gemm_f32.cpp", "kv_store.cpp", "layer_loop.cpp"]
# fast-math lets the reductions vectorise (the softmax's exp is our own, vec.h); 512-bit
# vectors where the CPU has them (GCC prefers 256 on some that do). Compile
# flags only: the link does not pull in crtfastmath, so the process's FP mode is untouched.
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp")
# NOTE: -fopenmp links libgomp.so.1 by soname: the loader binds it to the copy torch already
# loaded (torch/lib/libgomp.so.1), so at::parallel_for here runs on torch's thread team and
# follows torch.set_num_threads. Without it the kernels' parallel_for loops ran serially.
LDFLAGS = ("-lmvec", "-fopenmp")


def build_key() -> str:
    """``<source + flags hash>-torch<version>``: what the built module depends on."""
    import torch

    digest = hashlib.sha256(b"built from src/")  # NOTE: not the folders of checkouts that built from theirs
    for path in _source_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(" ".join(FLAGS + LDFLAGS).encode())  # NOTE: tuples: torch's load appends to the lists it is given
    digest.update(_cpu_flags().encode())
    digest.update(_torch_paths().encode())
    return f"{digest.hexdigest()[:12]}-torch{torch.__version__.replace('+', '_')}"


def _source_files() -> list[Path]:
    return sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h"))


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


def _torch_paths() -> str:
    """Where torch and Python's headers are: torch's ninja file names them, so two venvs
    with the same sources in one folder would rebuild the module at every switch."""
    import sysconfig

    import torch

    return f"{Path(torch.__file__).parent}\0{sysconfig.get_paths()['include']}"


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux), so a cache folder moved to another CPU is not loaded there."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line for line in text.splitlines() if line.startswith("flags")), "")


def build_dir() -> Path:
    default = Path.home() / ".cache" / "radixmesh" / "torch_extensions"
    path = Path(os.environ.get("RADIXMESH_EXT_DIR", default)) / build_key()
    path.mkdir(parents=True, exist_ok=True)
    return path


def load() -> ModuleType:
    """The compiled module (``paged_decode``, ``paged_extend``, ``paged_decode_v1``, ``amx_bf16``);
    raises BackendNotAvailable if it cannot build."""
    if os.environ.get("RADIXMESH_NO_CPU_EXT"):
        raise BackendNotAvailable("the cpu backend is disabled by RADIXMESH_NO_CPU_EXT")
    module = _build()
    if isinstance(module, BackendNotAvailable):
        raise module
    return module


def check_available(backend: str, device, dtype=None) -> None:
    """What every backend on these kernels requires: the CPU, a float dtype, the module
    built; raises BackendNotAvailable naming ``backend`` otherwise."""
    import torch

    if torch.device(device).type != "cpu":
        raise BackendNotAvailable(f"the {backend} attention backend runs on the CPU only")
    if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise BackendNotAvailable(f"the {backend} attention backend does not support {dtype}")
    load()


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
    """One build or load at a time per folder, under an ``flock`` the kernel releases when its
    holder dies: whoever holds it knows no live process is building, so a ``lock`` file of
    torch's found then was left by a killed build (a worker stopped during its first
    compile) and goes at once, instead of hanging every later start."""
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


@functools.cache  # NOTE: a failed build is cached too: it is not retried in this process
def _build() -> ModuleType | BackendNotAvailable:
    from torch.utils import cpp_extension

    directory = build_dir()
    try:
        log.info("loading the C++ CPU attention kernel (compiled on first use)")
        with build_lock(directory):
            return cpp_extension.load(
                name="radixmesh_cpu_kernels", sources=copy_sources(directory),
                extra_cflags=list(FLAGS), extra_ldflags=list(LDFLAGS),
                build_directory=str(directory), verbose=False,
            )
    except Exception as exc:  # noqa: BLE001 - no compiler, no ninja, a failed build
        log.warning("the C++ CPU kernel could not be built: %s", exc)
        return BackendNotAvailable(f"the C++ CPU kernel could not be built: {exc}")


if __name__ == "__main__":  # scripts/install.sh builds it ahead of the first worker
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        load()
        print(f"cpu attention kernel ready in {build_dir()}")
    except BackendNotAvailable as exc:
        print(f"cpu attention kernel unavailable (the torch backend will be used): {exc}")
