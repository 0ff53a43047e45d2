"""One ``radixmesh bench`` run: build the workload, run every system, write the outputs."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

from .client import ClientConfig
from .peer import PeerSpec, blank_radixmesh_columns, check_peer, reset_cache
from .record import Record, check
from .pd_mix import STREAM
from .report import class_table, markdown_table, pd_goals, plot, tier_goals, write_json
from .runner import Load
from .stats import Summary, summarize, summarize_by_kind
from .systems import (TIERED, BenchError, Plan, RunResult, SystemPlan, bench_http, plan_systems,
                      run_stack)
from .transfers import transfer_table
from .tokens import ChatTokenizer
from .workload import Workload
from .workloads import build_workload

QUICK_HF_REQUESTS = 4  # the sequential baseline is slow: --quick runs it on a prefix


def _overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--param wants NAME=VALUE, got {pair!r}")
        out[key] = value
    return out


def _validate(args: argparse.Namespace) -> None:
    for name in ("workers", "kv_slots", "max_concurrency", "hf_requests"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.request_rate <= 0:
        raise ValueError(f"--request-rate must be positive, got {args.request_rate}")
    if args.warmup < 0 or args.threads < 0:
        raise ValueError("--warmup and --threads must not be negative")
    _check_bench_extra(args)


def _check_bench_extra(args: argparse.Namespace) -> None:
    """Before any system runs: the plots and bars are the bench extra's (not in the image)."""
    import importlib.util

    wanted = ["tqdm"] + ([] if args.no_plots else ["matplotlib"])
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"needs {' and '.join(missing)}: pip install 'radixmesh[bench]'"
                         + ("" if "tqdm" in missing else " (or --no-plots)"))


def _progress(args: argparse.Namespace, name: str):
    """A tqdm bar; the runners reset it (total, clock) when timing starts."""
    from tqdm import tqdm

    return tqdm(total=0, desc=name, unit="req", file=sys.stderr, disable=args.no_progress,
                dynamic_ncols=True)


def _run_system(plan: SystemPlan, args, workload: Workload, tok: ChatTokenizer, model_dir: Path,
                out_dir: Path) -> RunResult:
    if plan.kind == "stack":
        print(f"[{plan.name}] starting a stack; logs in {out_dir / 'logs' / plan.name}",
              file=sys.stderr, flush=True)
    elif plan.kind == "hf":
        print(f"[{plan.name}] loading the model", file=sys.stderr, flush=True)
    with _progress(args, plan.name) as bar:
        if plan.kind == "hf":
            return RunResult(*_run_hf(args, workload, tok, model_dir, bar))
        bench = dict(workload=workload, tok=tok, warmup=args.warmup, timeout_s=args.timeout,
                     load=Load(args.request_rate, args.max_concurrency, args.seed),
                     client=ClientConfig(args.api, "", args.temperature, args.ignore_eos,
                                         args.seed), progress=bar)
        if plan.kind == "url":
            return asyncio.run(bench_http(args.url, plan.name, **bench))
        if plan.kind == "peer":
            client = dataclasses.replace(bench.pop("client"), api="chat", model=plan.peer.model)
            got = asyncio.run(bench_http(
                plan.url, plan.name, client=client,
                prepare=lambda stream: reset_cache(plan.name, stream.http, plan.peer), **bench))
            return got._replace(worker_idle=math.nan)  # NOTE: a radixmesh figure
        stack = dict(model=args.model, workers=args.workers, dtype=args.dtype,
                     kv_slots=args.kv_slots, threads_per_worker=args.threads)
        return run_stack(plan, stack, out_dir / "logs" / plan.name, args.startup_timeout,
                         **bench)


def _run_hf(args, workload: Workload, tok: ChatTokenizer, model_dir: Path, bar):
    import torch

    from .hf import HFBaseline

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    baseline = HFBaseline(model_dir, tok, args.temperature, args.ignore_eos, args.seed)
    baseline.warm_up()
    records, duration = baseline.run(workload, limit=args.hf_requests, progress=bar)
    return records, duration, math.nan  # NOTE: no worker, no idle fraction


def _meta(args: argparse.Namespace, workload: Workload, plan: Plan, model_dir: Path) -> dict:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor())
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    except OSError:  # NOTE: no git where it runs (the service image): the record says null
        commit = ""
    return {
        "command": "radixmesh bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"]
                                                 else sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__},
        "git_commit": commit or None, "model": str(model_dir),
        "workload": {"name": workload.name, "params": workload.params, "info": workload.info,
                     "seed": args.seed, "quick": args.quick},
        "load": {"request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
                 "warmup": args.warmup, "api": args.api, "temperature": args.temperature,
                 "ignore_eos": args.ignore_eos},
        "stack": None if args.url else {"workers": args.workers, "dtype": args.dtype,
                                        "kv_slots": args.kv_slots, "threads": args.threads},
        "url": args.url, "systems": [s.name for s in plan.systems], "notes": plan.notes,
        "layouts": {s.name: s.layout(args.workers) for s in plan.systems if s.kind == "stack"},
        "peers": {s.name: {"url": s.url, "model": s.peer.model, "start": s.peer.start,
                           "reset": s.peer.reset} for s in plan.systems if s.kind == "peer"},
        "ceilings": _ceilings(args, model_dir),
    }


def _ceilings(args: argparse.Namespace, model_dir: Path) -> dict:
    """This machine's matmul and copy ceilings, measured now at the workers' shapes, dtype
    and threads; {"line": why not} for a model the workers cannot load."""
    import torch

    from radixmesh.benchmarks import ceilings
    from services.gpu_worker.models.config import ModelConfig

    try:
        config = ModelConfig.from_dir(model_dir)
    except (ValueError, OSError, KeyError) as exc:
        return {"line": f"ceilings not measured: {exc}"}
    from services.gpu_worker.models.precision import DTYPES, resolve_dtype

    dtype = DTYPES[resolve_dtype(args.dtype, "cpu").name]
    got = ceilings.measure(config, dtype, args.threads or os.cpu_count() or 1)
    return {**dataclasses.asdict(got), "line": got.line()}


def _check_peers(plan: Plan, args: argparse.Namespace, tok: ChatTokenizer, model_dir: Path) -> None:
    """Every peer reachable and serving the workload's model, now: before any system runs."""
    async def check(system: SystemPlan) -> SystemPlan:
        info = await check_peer(PeerSpec(system.name, system.url), tok, model_dir.name, args.peer_model, args.timeout)
        if info.note:
            plan.notes.append(f"{system.name}: {info.note}")
        return dataclasses.replace(system, peer=info)

    async def all_of() -> list[SystemPlan]:
        return [await check(s) if s.kind == "peer" else s for s in plan.systems]

    if any(s.kind == "peer" for s in plan.systems):
        plan.systems = asyncio.run(all_of())
        if args.api != "chat" and any(s.kind != "peer" for s in plan.systems):
            plan.notes.append("the peers ran on /v1/chat/completions (gaps per chunk), radixmesh "
                              f"on --api {args.api}: --api chat puts both on the same API")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def run_session(args: argparse.Namespace) -> int:
    from libs.models import resolve_model

    _validate(args)
    if args.quick and args.hf_requests is None:
        args.hf_requests = QUICK_HF_REQUESTS
    model_dir = resolve_model(args.model)
    tok = ChatTokenizer.load(model_dir)
    workload = build_workload(args.workload, tok, args.seed, args.quick, _overrides(args.param))
    plan = plan_systems([s.strip() for s in args.systems.split(",") if s.strip()], args.url,
                        args.workers)
    if not plan.systems:
        raise BenchError("no system to run: " + "; ".join(plan.notes))
    _check_peers(plan, args, tok, model_dir)
    if args.hf_requests and args.hf_requests < len(workload.requests) and any(
            s.kind == "hf" for s in plan.systems):
        plan.notes.append(f"hf-generate ran only the first {args.hf_requests} of "
                          f"{len(workload.requests)} requests (--hf-requests)")
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.output_dir) / f"{stamp}-{workload.name}{'-quick' if args.quick else ''}"
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = _meta(args, workload, plan, model_dir)

    records: list[Record] = []
    summaries: list[Summary] = []
    classes: list[tuple[str, Summary]] = []
    transfers = []
    for system in plan.systems:
        try:
            got = _run_system(system, args, workload, tok, model_dir, out_dir)
        except BenchError as exc:  # NOTE: the systems that ran keep their results
            print(f"radixmesh bench: {exc}", file=sys.stderr)
            meta["notes"].append(f"{system.name} did not run: {exc}")
            meta.setdefault("not_run", []).append(system.name)
            continue
        records += got.records
        summary = summarize(system.name, got.records, got.duration_s, worker_idle=got.worker_idle)
        summaries.append(_started(system, summary))
        classes += summarize_by_kind(system.name, got.records, got.duration_s)
        if system.kind == "stack":
            transfers.append((system.name, system.layout(args.workers), got.transfers))
    if not summaries:
        raise BenchError("no system ran: " + "; ".join(meta["notes"]))
    meta["problems"] = problems = check(records)
    meta["transfers"] = {name: t and dataclasses.asdict(t) for name, _, t in transfers}
    extra = _extra_tables(plan, summaries, classes, transfers, workload.info.get("root_ideal_hit_rate", 0.0))
    return _finish(args, out_dir, meta, summaries, records, problems, classes, extra)


def _started(system: SystemPlan, summary: Summary) -> Summary:
    """``summary`` with the prefix cache at its start (a stack of the harness's starts cold,
    a gateway at --url warm) and, for a peer, the radixmesh-only figures unknown."""
    if system.kind == "peer":
        return dataclasses.replace(blank_radixmesh_columns(summary), start=system.peer.start)
    return dataclasses.replace(summary, start={"stack": "cold", "url": "warm"}.get(system.kind, "-"))


def _extra_tables(plan: Plan, summaries: list[Summary], classes: list[tuple[str, Summary]],
                  transfers: list, ideal: float = 0.0) -> str:
    """The per-class table (a workload of several request kinds), the KV transfers and
    the disaggregation goals (a run with prefill/decode workers), the memory tiers'
    goals (a run with tiers on and off)."""
    parts = ["\n".join(tier_goals(summaries, "radixmesh", list(TIERED), ideal))]
    if len({kind for kind, _ in classes}) > 1:
        parts.append(class_table(classes))
    if any(dict(p.stack).get("prefill_workers") for p in plan.systems):
        parts.append(transfer_table(transfers))
        parts += pd_goals(summaries, classes, "radixmesh", "radixmesh-pd", STREAM)
    return "\n\n".join(p for p in parts if p)


def _finish(args, out_dir: Path, meta: dict, summaries: list[Summary], records: list[Record],
            problems: list[str], classes: list[tuple[str, Summary]], extra: str) -> int:
    info = meta["workload"]["info"]
    header = (f"workload {meta['workload']['name']}{' (quick)' if args.quick else ''}: "
              f"{info['requests']} requests, seed {args.seed}, rate {args.request_rate} req/s, "
              f"max concurrency {args.max_concurrency or 'unbounded'}, api {args.api}, "
              f"{meta['machine']['cores']} cores ({meta['machine']['cpu']}), {meta['date']}\n"
              f"{meta['ceilings']['line']}")
    table = markdown_table(summaries) + (f"\n\n{extra}" if extra else "")
    (out_dir / "table.md").write_text(f"{meta['command']}\n\n{header}\n\n{table}\n")
    write_json(out_dir / "results.json", meta, summaries, records, classes)
    files = [out_dir / "results.json", out_dir / "table.md"]
    if not args.no_plots:
        files += plot(out_dir, summaries, records, meta["workload"]["name"])
    print(f"\n{header}\n\n{table}\n")
    for s in summaries:
        failed = [r for r in records if r.system == s.system and not r.ok]
        for r in failed[:3]:
            print(f"failed: {s.system}/{r.id}: {r.error}", file=sys.stderr)
    for note in meta["notes"]:
        print(f"note: {note}")
    for problem in problems:
        print(f"inconsistent: {problem}", file=sys.stderr)
    print("wrote " + ", ".join(str(f) for f in files))
    return 1 if problems or meta.get("not_run") or any(s.failed for s in summaries) else 0
