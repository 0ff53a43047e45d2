"""The mesh benchmark's tables: CPU per decode step and per token, by service and by process."""

from __future__ import annotations

import argparse
import os
import re

SERVICES = ("scheduler", "gateway", "tokenizer", "nats-server", "cache_index", "gpu_worker")


def service_of(process: str) -> str:
    """``gateway-1`` -> ``gateway``, ``gpu_worker-0`` -> ``gpu_worker``; ``nats-server`` as is."""
    return "nats-server" if process.startswith("nats-server") else re.sub(r"-\d+$", "", process)


def _median(values: list[float]) -> float:
    finite = sorted(v for v in values if v == v)
    return finite[len(finite) // 2] if finite else float("nan")


def per_process(readings: list, batch: int, per: str) -> dict[str, float]:
    """Median CPU ms per decode step of ``batch`` tokens (``per="step"``) or us per token
    (``"token"``) by process. NOTE: steps are counted as tokens / batch, not from the
    schedulers' step counters: requests that arrive over several steps (a loaded machine)
    add steps of fewer rows, and by different numbers in the long and the short run."""
    scale = batch * 1e3 if per == "step" else 1e6
    return {n: _median([r.cpu[n] / r.tokens * scale for r in readings if r.tokens > 0])
            for n in readings[0].cpu}


def per_service(readings: list, batch: int, per: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in per_process(readings, batch, per).items():
        if name != "client":
            out[service_of(name)] = out.get(service_of(name), 0.0) + value
    return out


def print_tables(results: dict[int, list], args: argparse.Namespace) -> None:
    cores = os.cpu_count() or 1
    pd = getattr(args, "pd", None)
    workers = f"{pd[0]} prefill + {pd[1]} decode worker(s)" if pd else f"{getattr(args, 'workers', 1)} worker(s)"
    print(f"\nmesh CPU, tiny Llama (1 layer, hidden 64), {workers}, {args.gateways} gateway(s), "
          f"{args.tokenizers} tokenizer(s), {cores} cores; steady decode = {args.steps}-step run minus "
          f"{args.short_steps}-step run, median of {args.rounds}")
    idle = getattr(args, "idle", None)
    if idle is not None:
        rates = {}
        for name, seconds in idle.cpu.items():
            if name != "client":
                rates[service_of(name)] = rates.get(service_of(name), 0.0) + seconds / idle.wall * 1e3
        print("idle CPU (ms per second, subtracted over each run's wall time): "
              + ", ".join(f"{k} {v:.1f}" for k, v in rates.items()))
    print("\nCPU ms per decode step (us per token in brackets):\n")
    print("| batch | steps/s | worker forward ms | " + " | ".join(SERVICES) + " | client |")
    print("|---|---|---|" + "---|" * (len(SERVICES) + 1))
    for b, readings in results.items():
        if not readings:
            continue
        steps, tokens = per_service(readings, b, "step"), per_service(readings, b, "token")
        client = (per_process(readings, b, "step")["client"], per_process(readings, b, "token")["client"])
        rate = _median([r.tokens / b / r.wall for r in readings])
        fwd = _median([r.forward_s / r.tokens * b * 1e3 for r in readings if r.tokens])
        cells = [_cell(steps.get(s, float("nan")), tokens.get(s, float("nan")), b) for s in SERVICES]
        print(f"| {b} | {rate:.0f} | {fwd:.2f} | " + " | ".join(cells) + f" | {_cell(*client, b)} |")
    _print_siblings(results)


def _cell(ms: float, us: float, batch: int) -> str:
    return f"{ms:.2f}" if batch == 1 else f"{ms:.2f} ({us:.1f})"


def _print_siblings(results: dict[int, list]) -> None:
    """Where a service runs as several processes: each one's CPU per token of all tokens."""
    batch, last = [(b, rs) for b, rs in results.items() if rs][-1]
    by_process = per_process(last, batch, "token")
    groups: dict[str, list[str]] = {}
    for name in by_process:
        groups.setdefault(service_of(name), []).append(name)
    # NOTE: gateways and tokenizers split one stream of work; schedulers drive a worker each
    shared = {s: ns for s, ns in groups.items() if len(ns) > 1 and s in ("gateway", "tokenizer")}
    if not shared:
        return
    print(f"\nbatch {batch}, us per token (of all tokens) by process:\n")
    for service, names in shared.items():
        values = [by_process[n] for n in names]
        spread = max(values) / min(values) - 1 if min(values) > 0 else float("nan")
        print(f"- {service}: " + ", ".join(f"{n} {by_process[n]:.1f}" for n in names)
              + f"; sum {sum(values):.1f}; spread {spread:.0%}")
