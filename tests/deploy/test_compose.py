"""compose.yaml (+ the GPU and smoke overrides) through the real Compose v2 binary, no engine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from .conftest import BASE, GPU, RADIXMESH_SERVICES, ROOT, SMOKE, normalized, run_compose

FILE_SETS = {"base": (BASE,), "gpu": (BASE, GPU), "smoke": (BASE, SMOKE)}


@pytest.mark.parametrize("profile", [None, "metrics", "*"])
@pytest.mark.parametrize("files", list(FILE_SETS))
def test_config_is_valid(files, profile):
    args = ("--profile", profile) if profile else ()
    out = run_compose(*args, "config", "-q", files=FILE_SETS[files])
    assert out.returncode == 0, out.stderr
    assert "warn" not in out.stderr.lower(), out.stderr  # e.g. an unset variable without default


def test_an_invalid_file_fails(tmp_path: Path):
    """Guards the exit-code trap: a broken file must give a non-zero status."""
    (tmp_path / "compose.yaml").write_text(
        "services:\n  a:\n    image: x\n    depends_on:\n      nowhere:\n        condition: service_healthy\n"
    )
    out = run_compose("config", "-q", cwd=tmp_path)
    assert out.returncode != 0
    assert "nowhere" in out.stderr


def test_services_are_health_gated(config):
    services = config["services"]
    for name in RADIXMESH_SERVICES:
        check = services[name]["healthcheck"]["test"]
        assert check == ["CMD", "python", "-m", "radixmesh.health", name]
        assert services[name]["depends_on"]["nats"]["condition"] == "service_healthy"
    for name, svc in services.items():
        for dep, spec in svc.get("depends_on", {}).items():
            if spec["condition"] == "service_healthy":
                assert not services[dep].get("healthcheck", {}).get("disable"), f"{name} waits on {dep}"
                assert "test" in services[dep]["healthcheck"] or dep == "nats", dep
            else:
                assert (dep, spec["condition"]) in {
                    ("models", "service_completed_successfully"), ("jaeger", "service_started")
                }, (name, dep)
    gateway_waits_for = {d for d, s in services["gateway"]["depends_on"].items() if s["condition"] == "service_healthy"}
    assert gateway_waits_for == {"nats", "tokenizer", "cache_index", "scheduler", "gpu_worker"}
    for name in RADIXMESH_SERVICES:  # stopped before the collector: last spans get out
        assert services[name]["depends_on"]["jaeger"]["condition"] == "service_started"


def test_model_is_prepared_once_into_a_named_volume(config):
    services = config["services"]
    models = services["models"]
    assert models["command"] == ["models", "default"]
    assert [(v["type"], v["source"], v["target"], v.get("read_only", False)) for v in models["volumes"]] == [
        ("volume", "models", "/models", False)
    ]
    for name in ("tokenizer", "gpu_worker"):
        assert services[name]["depends_on"]["models"]["condition"] == "service_completed_successfully"
        assert [(v["source"], v["target"], v.get("read_only")) for v in services[name]["volumes"]] == [
            ("models", "/models", True)
        ]
    assert "models" in config["volumes"]


def test_every_service_exports_traces_to_jaeger(config):
    services = config["services"]
    for name in RADIXMESH_SERVICES:
        env = services[name]["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318", name
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf", name
    jaeger = services["jaeger"]
    assert jaeger["image"].startswith("jaegertracing/jaeger:2.")
    assert jaeger["environment"]["JAEGER_LISTEN_HOST"] == "0.0.0.0"
    assert [(p["target"], p["published"]) for p in jaeger["ports"]] == [(16686, "16686")]


def test_broker_needs_credentials(config):
    nats = config["services"]["nats"]
    user, password = nats["environment"]["NATS_USER"], nats["environment"]["NATS_PASSWORD"]
    assert user and password
    assert "ports" not in nats  # reached only inside the compose network
    conf = (ROOT / "docker" / "nats.conf").read_text()
    assert re.search(r"authorization\s*{\s*user:\s*\$NATS_USER\s*password:\s*\$NATS_PASSWORD\s*}", conf)
    assert re.search(r"jetstream\s*{", conf)
    assert [c["target"] for c in nats["configs"]] == ["/etc/nats/radixmesh.conf"]
    assert nats["command"] == ["nats-server", "--config", "/etc/nats/radixmesh.conf"]
    for name in RADIXMESH_SERVICES:
        assert config["services"][name]["environment"]["NATS_URL"] == f"nats://{user}:{password}@nats:4222"


def test_credentials_come_from_the_environment():
    env = {"NATS_USER": "alice", "NATS_PASSWORD": "s3cret"}
    services = normalized(env=env)["services"]
    assert services["nats"]["environment"] == env
    assert services["gpu_worker"]["environment"]["NATS_URL"] == "nats://alice:s3cret@nats:4222"


def test_scaled_services_have_no_fixed_names_or_host_ports(config):
    for name in RADIXMESH_SERVICES:
        svc = config["services"][name]
        assert "container_name" not in svc, name
        assert "hostname" not in svc, name
        assert not {"RADIXMESH_INSTANCE", "RADIXMESH_WORKER_ID"} & set(svc["environment"]), name
        if name != "gateway":
            assert "ports" not in svc, name
    assert [p["published"] for p in config["services"]["gateway"]["ports"]] == ["8000"]


def test_worker_count_from_env():
    services = normalized(env={"RADIXMESH_WORKERS": "3"})["services"]
    assert services["gpu_worker"]["deploy"]["replicas"] == 3


def test_cpu_by_default_gpu_by_override(config):
    for name, svc in config["services"].items():
        assert not svc.get("deploy", {}).get("resources"), name
    assert config["services"]["gpu_worker"]["environment"]["RADIXMESH_DEVICE"] == "cpu"
    gpu = normalized(files=(BASE, GPU))["services"]
    worker = gpu["gpu_worker"]
    assert worker["deploy"]["resources"]["reservations"]["devices"] == [
        {"capabilities": ["gpu"], "driver": "nvidia", "count": 1}
    ]
    assert worker["build"]["args"]["VARIANT"] == "cuda"
    assert worker["image"] == "radixmesh:cuda"
    assert worker["environment"]["RADIXMESH_DEVICE"] == "cuda"
    assert worker["deploy"]["replicas"] == 1  # still scalable with --scale
    for name in ("tokenizer", "gateway", "models"):
        assert gpu[name]["image"] == "radixmesh:cpu", name


def test_prometheus_only_with_the_metrics_profile(config):
    assert "prometheus" not in normalized()["services"]
    prometheus = config["services"]["prometheus"]
    assert prometheus["profiles"] == ["metrics"]
    assert [c["target"] for c in prometheus["configs"]] == ["/etc/prometheus/prometheus.yml"]
    scrape = yaml.safe_load((ROOT / "observability" / "prometheus.yml").read_text())["scrape_configs"]
    gateway = next(job for job in scrape if job["job_name"] == "gateway")
    assert gateway["metrics_path"] == "/metrics"
    assert gateway["dns_sd_configs"] == [{"names": ["gateway"], "type": "A", "port": 8000, "refresh_interval": "30s"}]


def test_public_images_are_pinned(config):
    for name, svc in config["services"].items():
        image = svc["image"]
        assert ":" in image and not image.endswith(":latest"), (name, image)


def test_smoke_override_needs_no_registry():
    services = normalized(files=(BASE, SMOKE), profiles=())["services"]
    assert {svc["image"] for svc in services.values()} == {"radixmesh:smoke"}
    assert services["jaeger"]["command"][:2] == ["python", "/opt/otlp_receiver.py"]
    assert [p["target"] for p in services["jaeger"]["ports"]] == [4318]
