"""The C++ kernels' build folder: keyed by what the built module depends on."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch

from libs.kernels import cpu_ext


def test_build_folder_is_keyed_by_sources_headers_flags_cpu_and_torch_and_its_place(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXMESH_EXT_DIR", str(tmp_path / "ext"))
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "kernel.cpp").write_text("int f() { return 1; }\n")
    (csrc / "vec.h").write_text("#pragma once\n")
    monkeypatch.setattr(cpu_ext, "CSRC", csrc)
    first = cpu_ext.build_dir()
    assert first.parent == tmp_path / "ext" and first.is_dir()
    assert first.name.endswith("-torch" + torch.__version__.replace("+", "_"))
    assert cpu_ext.build_dir() == first  # stable while nothing changes
    (csrc / "kernel.cpp").write_text("int f() { return 2; }\n")
    edited = cpu_ext.build_dir()
    (csrc / "vec.h").write_text("#pragma once\n// changed\n")
    header = cpu_ext.build_dir()
    monkeypatch.setattr(cpu_ext, "FLAGS", (*cpu_ext.FLAGS, "-DX"))
    flagged = cpu_ext.build_dir()
    monkeypatch.setattr(cpu_ext, "_cpu_flags", lambda: "flags : fpu sse2")  # another CPU
    other_cpu = cpu_ext.build_dir()
    # another venv: torch's ninja file names its headers, so sharing would rebuild at each switch
    monkeypatch.setattr(cpu_ext, "_torch_paths", lambda: "/other/.venv/site-packages/torch")
    other_venv = cpu_ext.build_dir()
    assert len({first, edited, header, flagged, other_cpu, other_venv}) == 6


def test_loading_leaves_the_key_as_it_was():
    """torch's load appends its own link flags to the list it is given: the key must not see them."""
    assert isinstance(cpu_ext.FLAGS, tuple) and isinstance(cpu_ext.LDFLAGS, tuple)  # nothing can append
    before = cpu_ext.build_key()
    cpu_ext.load()
    assert cpu_ext.build_key() == before


def test_the_build_reads_copies_in_its_folder_so_checkouts_share_it(tmp_path, monkeypatch):
    """Two checkouts with the same sources: one folder, one set of source paths (torch's
    ninja file names them; paths that differ would rebuild the module at every switch)."""
    monkeypatch.setenv("RADIXMESH_EXT_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(cpu_ext, "SOURCES", ["kernel.cpp"])
    folders, sources = [], []
    for checkout in ("a", "b"):
        csrc = tmp_path / checkout / "csrc"
        csrc.mkdir(parents=True)
        (csrc / "kernel.cpp").write_text('#include "vec.h"\nint f() { return 1; }\n')
        (csrc / "vec.h").write_text("#pragma once\n")
        monkeypatch.setattr(cpu_ext, "CSRC", csrc)
        folders.append(cpu_ext.build_dir())
        sources.append(cpu_ext.copy_sources(folders[-1]))
    assert folders[0] == folders[1] and sources[0] == sources[1] == [str(folders[0] / "src" / "kernel.cpp")]
    assert (folders[0] / "src" / "vec.h").read_text() == "#pragma once\n"  # headers beside their sources
    before = (folders[0] / "src" / "kernel.cpp").stat().st_mtime_ns
    cpu_ext.copy_sources(folders[0])
    assert (folders[0] / "src" / "kernel.cpp").stat().st_mtime_ns == before  # not rewritten: ninja sees no change


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
