"""``radixmesh bench``: run one workload on several systems side by side.

    radixmesh bench --workload handbook            # starts its own stacks
    radixmesh bench --url http://127.0.0.1:8000    # a running gateway (+ HF baseline)
    radixmesh bench --quick                        # small sizes, < 3 minutes on 2 cores
    radixmesh bench --systems radixmesh,vllm:openai=http://127.0.0.1:8100  # beside a peer

Writes results.json (every record), table.md, ttft.png and throughput.png into
``--output-dir``/<date>-<workload>/ and prints the table.
"""

from __future__ import annotations

import argparse
import math
import sys

from .client import APIS
from .systems import DEFAULT_SYSTEMS, ROUTING_POLICIES, SYSTEMS
from .workloads import WORKLOADS


def add_arguments(p: argparse.ArgumentParser) -> None:
    target = p.add_argument_group("target")
    target.add_argument("--url", help="benchmark the gateway at URL instead of starting stacks")
    target.add_argument("--model", default="default", help="local HF model dir, or 'default'")
    target.add_argument("--workers", type=int, default=1,
                        help="gpu_workers per started stack (radixmesh-pd: as many, split "
                             "into prefill and decode workers)")
    target.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                        help="the workers' dtype, as `radixmesh up` takes it (auto: bf16 where "
                             "the CPU computes it natively, fp32 elsewhere)")
    target.add_argument("--kv-slots", type=int, default=16384, help="KV tokens per worker")
    target.add_argument("--threads", type=int, default=0,
                        help="torch threads per worker and for the HF baseline (0: all cores)")
    target.add_argument("--startup-timeout", type=float, default=300.0)
    work = p.add_argument_group("workload")
    work.add_argument("--workload", choices=sorted(WORKLOADS), default="handbook")
    work.add_argument("--quick", action="store_true", help="small sizes (smoke test, CI)")
    work.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                      help="override a workload parameter, e.g. --param readers=48")
    work.add_argument("--seed", type=int, default=0)
    load = p.add_argument_group("load")
    load.add_argument("--request-rate", type=float, default=math.inf,
                      help="root requests per second, Poisson (default inf: all at once)")
    load.add_argument("--max-concurrency", type=int, default=None,
                      help="requests in flight at most (default: unbounded)")
    load.add_argument("--warmup", type=int, default=2, help="unrelated requests before timing")
    load.add_argument("--api", choices=APIS, default="generate",
                      help="generate: /generate, exact per-token timing; chat: OpenAI chat")
    load.add_argument("--temperature", type=float, default=0.0)
    load.add_argument("--ignore-eos", action="store_true", help="always emit max_tokens tokens")
    load.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    out = p.add_argument_group("systems and output")
    out.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                     help=f"comma-separated, from {','.join(SYSTEMS)}, radixmesh-<policy> "
                          f"for a routing policy in {','.join(ROUTING_POLICIES)}, "
                          "radixmesh-index<N> (N cache index replicas, e.g. radixmesh-index2), "
                          "radixmesh-index<N>-kill (one replica SIGKILLed mid-run), and "
                          "[LABEL:]openai=URL for a running OpenAI-compatible server (a peer: "
                          "vLLM, SGLang, llama.cpp, another radixmesh), never started or stopped "
                          "here")
    out.add_argument("--peer-model", default=None,
                     help="the model name to ask the peers for (default: the one their "
                          "/v1/models lists, or the one named like --model's folder)")
    out.add_argument("--hf-requests", type=int, default=None,
                     help="run only the first N requests on hf-generate (it is sequential)")
    out.add_argument("--output-dir", default="bench-results")
    out.add_argument("--no-plots", action="store_true")
    out.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from .session import run_session
    from .systems import BenchError

    try:
        return run_session(args)
    except (BenchError, ValueError) as exc:
        print(f"radixmesh bench: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixmesh bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))
