"""The C++ kernel's build folder: keyed by what the built module depends on."""

from __future__ import annotations

import torch

from libs.kernels import cpu_ext


def test_build_folder_is_keyed_by_source_flags_and_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXMESH_EXT_DIR", str(tmp_path))
    source = tmp_path / "kernel.cpp"
    source.write_text("int f() { return 1; }\n")
    monkeypatch.setattr(cpu_ext, "SOURCE", source)
    first = cpu_ext.build_dir()
    assert first.parent == tmp_path and first.is_dir()
    assert first.name.endswith("-torch" + torch.__version__.replace("+", "_"))
    assert cpu_ext.build_dir() == first  # stable while nothing changes
    source.write_text("int f() { return 2; }\n")
    edited = cpu_ext.build_dir()
    monkeypatch.setattr(cpu_ext, "FLAGS", [*cpu_ext.FLAGS, "-DX"])
    flagged = cpu_ext.build_dir()
    assert len({first, edited, flagged}) == 3
