"""``radixmesh simulate``: the cache index's routing code over simulated workers.

    radixmesh simulate                       # 64 workers, every policy, one trace
    radixmesh simulate --workers 128 --json sim.json
    radixmesh simulate --quick               # 16 workers, a few seconds

No model, no broker: services/cache_index's Router, Registry and PrefixIndex
route a synthetic multi-document trace (Zipf popularity, Poisson arrivals) to
workers that each keep a real RadixCache and a service-time model calibrated
on this repo's CPU worker. Prints one markdown row per policy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

POLICY_ORDER = ("cache_aware", "round_robin", "least_load", "random", "prefix_hash")


def add_arguments(p: argparse.ArgumentParser) -> None:
    trace = p.add_argument_group("trace")
    trace.add_argument("--workers", type=int, default=None, help="simulated workers (default 64)")
    trace.add_argument("--requests", type=int, default=0, help="requests (0: 20 x workers)")
    trace.add_argument("--docs", type=int, default=0, help="documents (0: 4 x workers)")
    trace.add_argument("--doc-tokens", type=int, nargs=2, default=(1000, 2000),
                       metavar=("MIN", "MAX"), help="tokens per document")
    trace.add_argument("--question-tokens", type=int, nargs=2, default=(30, 50),
                       metavar=("MIN", "MAX"), help="tokens per question")
    trace.add_argument("--system-tokens", type=int, default=0,
                       help="system prefix shared by every request")
    trace.add_argument("--output-tokens", type=int, default=64, help="tokens generated per request")
    trace.add_argument("--zipf", type=float, default=1.1, help="document popularity exponent")
    trace.add_argument("--rate", type=float, default=0.0,
                       help="arrivals per second (0: --utilisation x capacity)")
    trace.add_argument("--utilisation", type=float, default=0.7,
                       help="load as a fraction of the capacity under perfect caching")
    trace.add_argument("--seed", type=int, default=0)
    trace.add_argument("--quick", action="store_true",
                       help="small run: 16 workers, 10 requests per worker")
    worker = p.add_argument_group("worker model (defaults measured on 2 CPU cores)")
    worker.add_argument("--prefill-tps", type=float, default=650.0, help="prefill tokens/s")
    worker.add_argument("--decode-base", type=float, default=0.052,
                        help="decode step seconds at batch 0")
    worker.add_argument("--decode-per-seq", type=float, default=0.0043,
                        help="extra decode step seconds per request in the batch")
    worker.add_argument("--chunk", type=int, default=1024, help="prefill tokens per step")
    worker.add_argument("--kv-slots", type=int, default=16384, help="KV tokens per worker")
    worker.add_argument("--page-size", type=int, default=16)
    worker.add_argument("--max-running", type=int, default=256)
    worker.add_argument("--host-kv-slots", type=int, default=0,
                        help="host tier KV tokens per worker (0: none): evictions demote there")
    worker.add_argument("--host-load-tps", type=float, default=20_000.0,
                        help="host tier copy rate, KV tokens/s (measured: libs.transfer.bench)")
    route = p.add_argument_group("routing and output")
    route.add_argument("--policies", default=",".join(POLICY_ORDER),
                       help="comma-separated policies to run on the same trace")
    route.add_argument("--report-interval", type=float, default=0.5,
                       help="seconds between a worker's LoadReports (the scheduler's 0.5)")
    route.add_argument("--report-on-change", action="store_true",
                       help="also report after every step and arrival")
    route.add_argument("--json", type=Path, default=None, help="write setup and results here")


def run(args: argparse.Namespace) -> int:
    from .engine import Simulation
    from .report import describe, markdown, summarize, write_json

    try:
        trace, model, policies = _build(args)
        runs = [Simulation(trace, model, policy, args.report_interval, args.report_on_change)
                for policy in policies]
    except ValueError as exc:
        print(f"radixmesh simulate: {exc}", file=sys.stderr)
        return 2
    print(describe(trace, model), flush=True)
    rows = []
    for sim in runs:
        rows.append(summarize(sim.run()))
        print(f"  {sim.policy}: simulated in {rows[-1].wall_s:.1f} s", file=sys.stderr, flush=True)
    print()
    print(markdown(rows))
    if args.json:
        write_json(args.json, {"command": " ".join(sys.argv), "trace": vars(trace.config),
                               "rate": trace.rate, "model": vars(model)}, rows)
        print(f"\nwrote {args.json}")
    return 0


def _build(args: argparse.Namespace):
    from .model import ServiceModel
    from .trace import TraceConfig, make_trace

    workers = args.workers if args.workers is not None else (16 if args.quick else 64)
    requests = args.requests or (10 * workers if args.quick else 0)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = sorted(set(policies) - set(POLICY_ORDER))
    if unknown or not policies:
        raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICY_ORDER)}")
    model = ServiceModel(
        prefill_tps=args.prefill_tps, decode_base_s=args.decode_base,
        decode_per_seq_s=args.decode_per_seq, chunk_tokens=args.chunk, kv_slots=args.kv_slots,
        page_size=args.page_size, max_running=args.max_running, host_slots=args.host_kv_slots,
        host_load_tps=args.host_load_tps,
    )
    config = TraceConfig(
        workers=workers, requests=requests, docs=args.docs, doc_tokens=tuple(args.doc_tokens),
        question_tokens=tuple(args.question_tokens), system_tokens=args.system_tokens,
        output_tokens=args.output_tokens, zipf=args.zipf, rate=args.rate,
        utilisation=args.utilisation, seed=args.seed,
    )
    return make_trace(config, model), model, policies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixmesh simulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))
