"""scripts/install.sh: the pip steps run once, then only when what they install from changes;
matplotlib and tqdm are the bench extra's, out of the service image."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

from .conftest import ROOT

# NOTE: a stand-in for .venv/bin/python: logs its arguments, answers -VV
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/calls.log"
if [ "$1" = "-VV" ]; then echo "Python 3.11.7"; fi
"""


def _checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install.sh", repo / "scripts" / "install.sh")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    return repo


def _install(repo: Path, tmp_path: Path, **env: str) -> list[str]:
    """Run install.sh; the fake python's calls. apt-get / dpkg are stubs that succeed."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for tool in ("apt-get", "dpkg"):
        (stubs / tool).write_text("#!/bin/sh\nexit 0\n")
        (stubs / tool).chmod(0o755)
    log = repo / ".venv" / "bin" / "calls.log"
    log.unlink(missing_ok=True)
    path = f"{stubs}{os.pathsep}{os.environ['PATH']}"
    out = subprocess.run(["bash", "scripts/install.sh"], cwd=repo, capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PATH=path, **env))
    assert out.returncode == 0, out.stderr
    return [line for line in log.read_text().splitlines() if line != "-VV"]


def test_a_second_install_skips_pip_until_pyproject_changes(tmp_path):
    repo = _checkout(tmp_path)
    first = _install(repo, tmp_path)
    assert "-m pip install -q -e .[test,bench]" in first
    assert first[-2:] == ["-m libs.models", "-m libs.kernels.cpu_ext"]
    assert _install(repo, tmp_path) == ["-m libs.models", "-m libs.kernels.cpu_ext"]
    with open(repo / "pyproject.toml", "a") as f:
        f.write("\n# a new dependency\n")
    assert any("pip install" in call for call in _install(repo, tmp_path))
    assert not any("pip" in call for call in _install(repo, tmp_path))
    forced = _install(repo, tmp_path, RADIXMESH_REINSTALL="1")
    assert any("pip install" in call for call in forced)


def test_a_failed_pip_step_leaves_no_stamp(tmp_path):
    repo = _checkout(tmp_path)
    python = repo / ".venv" / "bin" / "python"
    python.write_text(FAKE_PYTHON + 'case "$*" in *"--upgrade pip"*) exit 1;; esac\n')
    out = subprocess.run(["bash", "scripts/install.sh"], cwd=repo, capture_output=True, timeout=60)
    assert out.returncode != 0
    assert not (repo / ".venv" / ".radixmesh-install").exists()


def test_bench_packages_are_an_extra_the_image_leaves_out():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {dep.split(">")[0].split("=")[0].strip() for dep in project["dependencies"]}
    assert not names & {"matplotlib", "tqdm"}
    assert {d.split(">")[0] for d in project["optional-dependencies"]["bench"]} == {"matplotlib", "tqdm"}
    # the image installs project.dependencies only (no extras)
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "['project']['dependencies']" in dockerfile and "[bench]" not in dockerfile
