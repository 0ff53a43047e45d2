"""Checks a running compose stack (used by scripts/compose_smoke.sh).

Sends concurrent chat completions to the gateway, asks the scheduler (over NATS,
from inside the scheduler container) how many requests each worker finished, reads the
spans the OTLP receiver got, checks that every worker container runs the C++ kernels
its CPU's best level (its ``cpu kernels:`` start line, not the torch fallback) and that the
image leaves out the bench extra (matplotlib, tqdm). Exits non-zero with the reason on failure.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

SERVICES = ("gateway", "tokenizer", "cache_index", "scheduler", "gpu_worker")
# One trace must cross these (the worker's forward steps are batched: their own traces).
REQUEST_PATH = ("gateway", "tokenizer", "cache_index", "scheduler")

PROBE = """
import asyncio, json, os
from libs.protocol import Bus, Subjects
from libs.protocol.messages import SchedStats, SchedStatsRequest, WorkersReply, WorkersRequest

async def main():
    s = Subjects(os.environ.get("RADIXMESH_SUBJECT_PREFIX", "rm"))
    bus = await Bus.connect(os.environ["NATS_URL"], "smoke-probe")
    try:
        workers = (await bus.request(s.index_workers(), WorkersRequest(), WorkersReply, 5)).workers
        out = {}
        for w in workers:
            st = await bus.request(s.sched_stats(w.worker_id), SchedStatsRequest(), SchedStats, 5)
            out[w.worker_id] = {"finished": st.requests_finished, "tokens": st.tokens_generated,
                                "scheduler": w.scheduler_id}
        print(json.dumps(out))
    finally:
        await bus.close()

asyncio.run(main())
"""


def fail(msg: str) -> None:
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def http_json(url: str, body: dict | None = None, timeout: float = 120.0) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def send_requests(api: str, n: int) -> str:
    model = http_json(f"{api}/v1/models")["data"][0]["id"]
    prompts = [f"Count from {i} to {i + 5}." for i in range(n)]

    def one(prompt: str) -> tuple[float, dict]:
        t = time.monotonic()
        reply = http_json(f"{api}/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 16, "temperature": 0,
        })
        return time.monotonic() - t, reply

    t0 = time.monotonic()
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, prompts))
    for latency, reply in results:
        text = reply["choices"][0]["message"]["content"]
        if not text or reply["usage"]["completion_tokens"] <= 0:
            fail(f"empty completion: {reply}")
    slowest = max(lat for lat, _ in results)
    print(f"{n} concurrent chat completions OK in {time.monotonic() - t0:.1f}s (slowest {slowest:.1f}s);"
          f" first: {results[0][1]['choices'][0]['message']['content']!r}")
    return model


def worker_stats(compose: list[str]) -> dict:
    out = subprocess.run([*compose, "exec", "-T", "scheduler", "python", "-c", PROBE],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail(f"probe failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_workers(compose: list[str], expected: int, requests: int) -> None:
    stats = worker_stats(compose)
    print("workers:", json.dumps(stats))
    if len(stats) < expected:
        fail(f"{len(stats)} workers registered, expected {expected}")
    idle = [w for w, s in stats.items() if s["finished"] <= 0]
    if idle:
        fail(f"workers that served nothing: {idle}")
    if sum(s["finished"] for s in stats.values()) < requests:
        fail(f"fewer finished requests than sent ({requests})")


# the start line of libs/kernels/cpu_ext.py: "cpu kernels: avx512bf16 (of avx2, avx512, avx512bf16)"
KERNELS_LINE = re.compile(r"cpu kernels: (\w+) \(of ([\w, ]+)\)")
# what that module logs instead where a worker runs below its CPU's best, or without the kernels
KERNELS_WARNING = re.compile(r"cpu kernels: (none|running \w+, below|\w+ is not built ahead|.* build failed)")
LEVELS_PROBE = ("import json; from libs.kernels import cpu_ext as c; "
                "print(json.dumps({'best': c.best_level(), 'built': c.built_levels()}))")


def check_kernels(compose: list[str], expected: int) -> None:
    """Each worker container's start line names a level built into the image, its CPU's best."""
    out = subprocess.run([*compose, "exec", "-T", "gpu_worker", "python", "-c", LEVELS_PROBE],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail(f"kernel levels probe failed: {out.stderr[-2000:]}")
    levels = json.loads(out.stdout.strip().splitlines()[-1])
    logs = subprocess.run([*compose, "logs", "--no-color", "gpu_worker"], capture_output=True, text=True,
                          timeout=60).stdout
    running: dict[str, str] = {}
    for line in logs.splitlines():
        container, _, message = line.partition("|")
        if KERNELS_WARNING.search(message):
            fail(f"{container.strip()}: {message.strip()}")
        if match := KERNELS_LINE.search(message):
            running[container.strip()] = match.group(1)
    print(f"cpu kernels: built in the image {levels['built']}; this CPU's best {levels['best']}; "
          f"workers: {running}")
    if len(running) < expected:
        fail(f"{len(running)} worker containers logged their cpu kernels, expected {expected}")
    wrong = {c: level for c, level in running.items() if level != levels["best"] or level not in levels["built"]}
    if wrong or levels["best"] is None:
        fail(f"workers not on the CPU's best built level {levels['best']}: {wrong}")


# NOTE: transformers, huggingface-hub and gguf require tqdm themselves (transformers does not
# import without it): the image may carry it for them, never for radixmesh's own sake.
DEPS_PROBE = """
import importlib.metadata as md, json, re
def name(d): return re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower()
dists = {name(d): d for d in md.distributions()}
def required_by(pkg):
    return sorted(n for n, d in dists.items()
                  if any(re.match(rf"{pkg}\\b", r, re.I) and "extra ==" not in r for r in d.requires or []))
print(json.dumps({pkg: {"installed": pkg in dists, "required_by": required_by(pkg)} for pkg in ("matplotlib", "tqdm")}))
"""
THIRD_PARTY_TQDM = {"transformers", "huggingface-hub", "gguf", "accelerate", "tokenizers"}


def check_image_deps(compose: list[str]) -> None:
    out = subprocess.run([*compose, "exec", "-T", "gateway", "python", "-c", DEPS_PROBE],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail(f"dependency probe failed: {out.stderr[-2000:]}")
    deps = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"bench extra in the image: {deps}")
    if deps["matplotlib"]["installed"]:
        fail(f"matplotlib is in the service image (required by {deps['matplotlib']['required_by']})")
    tqdm = deps["tqdm"]
    if tqdm["installed"] and not (tqdm["required_by"] and set(tqdm["required_by"]) <= THIRD_PARTY_TQDM):
        fail(f"tqdm is in the service image, required by {tqdm['required_by'] or 'nothing'}")


def check_traces(receiver: str, workers: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        spans = http_json(f"{receiver}/spans")
        by_trace: dict[str, set[str]] = defaultdict(set)
        instances: dict[str, set[str]] = defaultdict(set)
        for s in spans:
            service = s["service"].removeprefix("radixmesh-")
            by_trace[s["trace_id"]].add(service)
            instances[service].add(s["instance"])
        full = [t for t, svcs in by_trace.items() if set(REQUEST_PATH) <= svcs]
        missing = [s for s in SERVICES if s not in instances]
        ok = full and not missing and len(instances["gpu_worker"]) >= workers
        if ok or time.monotonic() > deadline:
            break
        time.sleep(1)
    print(f"traces: {len(spans)} spans, {len(by_trace)} traces, {len(full)} cross "
          f"{'->'.join(REQUEST_PATH)}; span counts by service: "
          f"{ {k: sum(1 for s in spans if s['service'].endswith(k)) for k in SERVICES} }; "
          f"gpu_worker instances: {sorted(instances['gpu_worker'])}")
    if missing:
        fail(f"no spans from {missing}")
    if not full:
        fail("no trace crosses the whole request path")
    if len(instances["gpu_worker"]) < workers:
        fail(f"spans from {len(instances['gpu_worker'])} gpu_worker instances, expected {workers}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--api", required=True)
    p.add_argument("--receiver", required=True, help="OTLP receiver base URL (GET /spans)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--compose", required=True, help="the docker-compose binary")
    args, compose_args = p.parse_known_args()
    compose = [args.compose, *compose_args]
    send_requests(args.api, args.requests)
    check_workers(compose, args.workers, args.requests)
    check_traces(args.receiver, args.workers)
    check_kernels(compose, args.workers)
    check_image_deps(compose)
    print("SMOKE OK")


if __name__ == "__main__":
    main()
