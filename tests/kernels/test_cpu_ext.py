"""The C++ kernels' build folder: keyed by what the built module depends on."""

from __future__ import annotations

import torch

from libs.kernels import cpu_ext


def test_build_folder_is_keyed_by_sources_headers_flags_cpu_and_torch(tmp_path, monkeypatch):
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
    assert len({first, edited, header, flagged, other_cpu}) == 5


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
